package kubernetes

import (
	"bytes"
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apiserver/pkg/util/proxy"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	utilexec "k8s.io/client-go/util/exec"
	criremote "k8s.io/cri-streaming/pkg/streaming/remotecommand"
	"k8s.io/streaming/pkg/httpstream/wsstream"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Exec is exercised here against a stand-in for the API server and the
// kubelet, built from the libraries the real ones use: WebSocket requests
// (v5.channel.k8s.io) go through k8s.io/apiserver's StreamTranslatorHandler,
// which is what kube-apiserver 1.37 runs for pods/exec, and it speaks SPDY
// to a "kubelet" serving k8s.io/cri-streaming's ServeExec (the kubelet's
// streaming server); SPDY requests go to that kubelet directly. The
// "container" is a working folder on this host and commands run as host
// processes — not isolated, so the isolation of cells is not what is tested
// here — and, like a container runtime, the kubelet does not kill a command
// when the client goes away: the driver's kill exec must.

// hostExecutor runs commands as host processes for the stand-in kubelet.
type hostExecutor struct {
	dir string
	mu  sync.Mutex
	all []*exec.Cmd
	// Requests the stand-in API server took over WebSocket (translated to
	// SPDY) and over SPDY.
	websocket, spdy atomic.Int64
}

func (h *hostExecutor) ExecInContainer(ctx context.Context, name, uid, container string, cmd []string, in io.Reader, out, errOut io.WriteCloser, tty bool, resize <-chan criremote.TerminalSize, timeout time.Duration) error {
	c := exec.Command(cmd[0], cmd[1:]...)
	c.Dir = h.dir
	c.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + h.dir}
	if in != nil {
		c.Stdin = in
	}
	c.Stdout, c.Stderr = out, errOut
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := c.Start(); err != nil {
		return err
	}
	h.mu.Lock()
	h.all = append(h.all, c)
	h.mu.Unlock()
	err := c.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code := ee.ExitCode()
		if code < 0 { // killed by a signal
			code = 128 + int(ee.Sys().(syscall.WaitStatus).Signal())
		}
		return utilexec.CodeExitError{Err: err, Code: code}
	}
	return err
}

// killAll ends whatever a failed test left behind.
func (h *hostExecutor) killAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.all {
		if c.Process != nil {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
		}
	}
}

// execServer is the stand-in API server; websocket false makes it refuse
// WebSocket upgrades, so the driver must fall back to SPDY.
func execServer(t *testing.T, websocket bool) (*rest.Config, *hostExecutor) {
	t.Helper()
	hx := &hostExecutor{dir: t.TempDir()}
	kubelet := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { kubeletDirect(w, r, hx) }))
	t.Cleanup(func() { hx.killAll(); kubelet.Close() })

	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/v1/namespaces/cells/pods/") || !strings.HasSuffix(r.URL.Path, "/exec") {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		// The kubelet's parameters, as kube-apiserver's ExecLocation
		// writes them.
		kq := url.Values{"command": q["command"], "container": {q.Get("container")}}
		opts := proxy.Options{Stdin: q.Get("stdin") == "true", Stdout: q.Get("stdout") == "true", Stderr: q.Get("stderr") == "true"}
		for param, on := range map[string]bool{"input": opts.Stdin, "output": opts.Stdout, "error": opts.Stderr} {
			if on {
				kq.Set(param, "1")
			}
		}
		loc, _ := url.Parse(kubelet.URL + "/exec/cells/pod/cell?" + kq.Encode())
		if wsstream.IsWebSocketRequest(r) {
			if !websocket || !wsstream.IsWebSocketRequestWithStreamCloseProtocol(r) {
				http.Error(w, "websocket refused", http.StatusBadRequest)
				return
			}
			hx.websocket.Add(1)
			proxy.NewStreamTranslatorHandler(loc, kubelet.Client().Transport, 0, opts).ServeHTTP(w, r)
			return
		}
		// SPDY: straight to the kubelet (kube-apiserver proxies the
		// upgraded connection).
		hx.spdy.Add(1)
		r2 := r.Clone(r.Context())
		r2.URL, r2.Form = loc, nil
		r2.RequestURI = loc.RequestURI()
		kubeletDirect(w, r2, hx)
	}))
	t.Cleanup(api.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})
	return &rest.Config{Host: api.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}}, hx
}

func kubeletDirect(w http.ResponseWriter, r *http.Request, hx *hostExecutor) {
	opts, err := criremote.NewOptions(r)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	criremote.ServeExec(w, r, hx, "pod/cells", "", r.FormValue("container"), r.Form["command"], opts,
		time.Minute, 30*time.Second, criremote.SupportedStreamingProtocols)
}

// execProvider is a provider whose Pods come from a fake clientset and
// whose exec goes to the stand-in server.
func execProvider(t *testing.T, websocket bool) (*Provider, driver.Object, *fake.Clientset, *hostExecutor) {
	t.Helper()
	cfg, hx := execServer(t, websocket)
	cs := fake.NewClientset()
	p, err := New(Config{
		RESTConfig: cfg, Client: cs, Namespace: "cells", Pool: "p", Installation: fakeInstallation,
		RuntimeClassNames: map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor", lease.KataMicroVM: "kata"},
		Image:             fakeImage,
	})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7())
	if err := cs.Tracker().Add(readyPod(p, id, "uid-1")); err != nil {
		t.Fatal(err)
	}
	return p, driver.Object{CellID: id, Identity: "uid-1"}, cs, hx
}

func TestExec(t *testing.T) {
	for _, transport := range []string{"websocket", "spdy"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel()
			p, obj, _, hx := execProvider(t, transport == "websocket")
			defer func() {
				ws, spdy := hx.websocket.Load(), hx.spdy.Load()
				if transport == "websocket" && (ws == 0 || spdy != 0) || transport == "spdy" && spdy == 0 {
					t.Errorf("%s: %d WebSocket and %d SPDY requests", transport, ws, spdy)
				}
				t.Logf("%s: %d WebSocket and %d SPDY requests", transport, ws, spdy)
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			run := func(req driver.ExecRequest) driver.ExecResult {
				t.Helper()
				if req.Timeout == 0 {
					req.Timeout = 30 * time.Second
				}
				res, err := p.Exec(ctx, obj, req)
				if err != nil {
					t.Fatalf("Exec(%q): %v", req.Argv, err)
				}
				return res
			}

			in := []byte("hello from stdin\nsecond line\n")
			if res := run(driver.ExecRequest{Argv: []string{"cat"}, Stdin: in}); res.ExitCode != 0 || !bytes.Equal(res.Stdout, in) || len(res.Stderr) != 0 || res.Duration <= 0 {
				t.Errorf("cat: %+v", res)
			}
			if res := run(driver.ExecRequest{Argv: []string{"sh", "-c", "printf out; printf err >&2"}}); string(res.Stdout) != "out" || string(res.Stderr) != "err" {
				t.Errorf("stdout/stderr: %+v", res)
			}
			if res := run(driver.ExecRequest{Argv: []string{"sh", "-c", "echo failing; exit 7"}}); res.ExitCode != 7 || string(res.Stdout) != "failing\n" {
				t.Errorf("exit code: %+v", res)
			}
			const value = "a value with spaces, = and 'quotes' $HOME `x`"
			res := run(driver.ExecRequest{Argv: []string{"sh", "-c", `printf '%s|%s' "$ONE" "$TWO"`}, Env: map[string]string{"ONE": value, "TWO": "2"}})
			if string(res.Stdout) != value+"|2" {
				t.Errorf("env: %q (stderr %q)", res.Stdout, res.Stderr)
			}
			arg := `one arg with "quotes", $dollars and ;semicolons`
			if res := run(driver.ExecRequest{Argv: []string{"printf", "%s", arg}}); string(res.Stdout) != arg {
				t.Errorf("argv: %q", res.Stdout)
			}
			res = run(driver.ExecRequest{Argv: []string{"sh", "-c", `i=0; while [ $i -lt 2000 ]; do echo 0123456789012345678901234567890123456789; echo abcdefghij >&2; i=$((i+1)); done; exit 3`}, MaxOutput: 1000})
			if !res.Truncated || len(res.Stdout) != 1000 || len(res.Stderr) != 1000 || res.ExitCode != 3 || !bytes.HasPrefix(res.Stdout, []byte("0123456789")) {
				t.Errorf("output cap: truncated %v, %d/%d bytes, exit %d", res.Truncated, len(res.Stdout), len(res.Stderr), res.ExitCode)
			}
			if res := run(driver.ExecRequest{Argv: []string{"printf", "0123456789"}, MaxOutput: 10}); res.Truncated || string(res.Stdout) != "0123456789" {
				t.Errorf("output at the cap: %+v", res)
			}

			// Timeout: the command and its children are killed by the
			// driver's second exec, not by the (stand-in) kubelet.
			secs := 600 + rand.IntN(300)
			start := time.Now()
			res, err := p.Exec(ctx, obj, driver.ExecRequest{Argv: []string{"sh", "-c", fmt.Sprintf("echo started; sleep %d; echo not reached", secs)}, Timeout: time.Second})
			if err != nil {
				t.Fatalf("Exec with a timeout: %v", err)
			}
			if !res.TimedOut || res.ExitCode == 0 || bytes.Contains(res.Stdout, []byte("not reached")) {
				t.Errorf("timeout: %+v", res)
			}
			// Only the lower bound is timed (a loaded machine is slower,
			// never faster): the timeout's effect is asserted above (timed
			// out, "not reached" never printed) and below (no process left);
			// an exec that ignored it would sleep for 10 minutes.
			if took := time.Since(start); took < time.Second {
				t.Errorf("timed-out exec returned after %v, before its 1 s timeout", took)
			}
			requireNoProcess(t, fmt.Sprintf("sleep\x00%d\x00", secs))

			// Cancellation: an error, and the command is killed too.
			secs = 600 + rand.IntN(300)
			cctx, ccancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer ccancel()
			if _, err := p.Exec(cctx, obj, driver.ExecRequest{Argv: []string{"sleep", fmt.Sprint(secs)}, Timeout: time.Minute}); err == nil {
				t.Error("Exec past its context's deadline succeeded")
			}
			requireNoProcess(t, fmt.Sprintf("sleep\x00%d\x00", secs))
			done, dcancel := context.WithCancel(ctx)
			dcancel()
			if _, err := p.Exec(done, obj, driver.ExecRequest{Argv: []string{"true"}}); err == nil {
				t.Error("Exec with a cancelled context succeeded")
			}
		})
	}
}

// requireNoProcess fails unless no host process has the command line
// marker within 30 s (it runs for 10 minutes unless it was killed).
func requireNoProcess(t *testing.T, marker string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second) // a hang guard: killed processes go in milliseconds
	for {
		found := ""
		procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
		for _, f := range procs {
			b, _ := os.ReadFile(f)
			if bytes.Contains(b, []byte(marker)) {
				found = f
			}
		}
		if found == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("process %q (%s) still runs after its exec ended", strings.ReplaceAll(marker, "\x00", " "), found)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestExecVerifiesFirst: exec re-reads the Pod and refuses one that is
// gone, replaced, terminating, not ready, or admitted under another class.
func TestExecVerifiesFirst(t *testing.T) {
	p, obj, cs, _ := execProvider(t, true)
	ctx := context.Background()
	req := driver.ExecRequest{Argv: []string{"true"}, Timeout: 10 * time.Second}
	set := func(mutate func(*corev1.Pod)) {
		t.Helper()
		pod := readyPod(p, obj.CellID, "uid-1")
		mutate(pod)
		if err := cs.Tracker().Update(podsGVR, pod, "cells"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := p.Exec(ctx, obj, req); err != nil {
		t.Fatalf("Exec on a verified pod: %v", err)
	}
	set(func(pod *corev1.Pod) { pod.Spec.RuntimeClassName = ptr("runc") })
	if _, err := p.Exec(ctx, obj, req); !errors.As(err, new(*driver.VerifyError)) {
		t.Errorf("runtime class changed: %v, want a *driver.VerifyError", err)
	}
	set(func(pod *corev1.Pod) { pod.Spec.RuntimeClassName = ptr("kata") })
	if _, err := p.Exec(ctx, obj, req); !errors.As(err, new(*driver.VerifyError)) {
		t.Errorf("runtime class swapped for another configured one: %v, want a *driver.VerifyError", err)
	}
	set(func(pod *corev1.Pod) { pod.Status.ContainerStatuses[0].Ready = false })
	if _, err := p.Exec(ctx, obj, req); err == nil || !strings.Contains(err.Error(), "not ready") {
		t.Errorf("not ready: %v", err)
	}
	set(func(pod *corev1.Pod) { pod.UID = types.UID("uid-2") })
	if _, err := p.Exec(ctx, obj, req); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("replaced pod: %v, want driver.ErrNotFound", err)
	}
	if err := cs.Tracker().Delete(podsGVR, "cells", PodName(obj.CellID)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Exec(ctx, obj, req); !errors.Is(err, driver.ErrNotFound) {
		t.Errorf("deleted pod: %v, want driver.ErrNotFound", err)
	}
	for _, bad := range []driver.ExecRequest{{}, {Argv: []string{"true"}, Env: map[string]string{"A-B": "x"}}, {Argv: []string{"true"}, Env: map[string]string{"": "x"}}} {
		if _, err := p.Exec(ctx, obj, bad); err == nil {
			t.Errorf("Exec(%+v) accepted", bad)
		}
	}
}

// TestExecStreamErrorIsNotTimeout: a stream that fails at once (here the
// API server answers 500 to every exec) is an error, not a timed-out
// command.
func TestExecStreamErrorIsNotTimeout(t *testing.T) {
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "no kubelet", http.StatusInternalServerError)
	}))
	defer api.Close()
	cs := fake.NewClientset()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: api.Certificate().Raw})
	p, err := New(Config{
		RESTConfig: &rest.Config{Host: api.URL, TLSClientConfig: rest.TLSClientConfig{CAData: ca}},
		Client:     cs, Namespace: "cells", Pool: "p", Installation: fakeInstallation,
		RuntimeClassNames: map[lease.RuntimeClass]string{lease.GVisorLowerRisk: "gvisor"},
		Image:             fakeImage,
	})
	if err != nil {
		t.Fatal(err)
	}
	id := uuid.Must(uuid.NewV7())
	if err := cs.Tracker().Add(readyPod(p, id, "uid-1")); err != nil {
		t.Fatal(err)
	}
	res, err := p.Exec(context.Background(), driver.Object{CellID: id, Identity: "uid-1"}, driver.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute})
	if err == nil {
		t.Fatalf("Exec = %+v, want an error", res)
	}
}
