// Package podexec runs a command in a Pod's container through the API
// server's pods/exec subresource (WebSocket, falling back to SPDY, as
// kubectl does), with the request's stdin, env, timeout and output caps.
// It is shared by the drivers that run cells as Pods; each does its own
// verification before calling Run.
package podexec

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/remotecommand"
	utilexec "k8s.io/client-go/util/exec"
	"k8s.io/streaming/pkg/httpstream"

	"github.com/sandboxwich/sandboxwich/driver"
)

// killTimeout bounds the extra exec that kills a timed-out or cancelled
// command.
const killTimeout = 15 * time.Second

// execScript runs the command. It records its own PID (which the command
// keeps, through exec) in a file named after the exec's random ID, exports
// the request's variables, and replaces itself with the command. Variables
// are passed as arguments, never interpolated into the script.
//
//	sh -c execScript sbw-exec <id> <n> K1=V1 … Kn=Vn argv…
const execScript = `f=/tmp/.sbw-exec-$1; n=$2; shift 2
while [ "$n" -gt 0 ]; do export "$1"; shift; n=$((n-1)); done
echo $$ > "$f" 2>/dev/null
exec "$@"`

// killScript kills the process tree rooted at the PID execScript recorded:
// it stops every process of the tree, rescanning /proc until no new member
// appears (a stopped process cannot fork), then kills them all. A process
// that left the tree (double fork) survives until the cell is destroyed.
// Exit 3: no PID recorded (yet).
//
//	sh -c killScript sbw-kill <id>
const killScript = `f=/tmp/.sbw-exec-$1
read -r root < "$f" 2>/dev/null || exit 3
tree=" $root "
kill -STOP "$root" 2>/dev/null || { rm -f "$f"; exit 0; }
grew=1
while [ "$grew" = 1 ]; do
  grew=0
  for s in /proc/[0-9]*/stat; do
    read -r l < "$s" 2>/dev/null || continue
    pid=${l%% *}
    set -- ${l##*) }
    case "$tree" in *" $pid "*) continue ;; esac
    case "$tree" in *" $2 "*) tree="$tree$pid "; kill -STOP "$pid" 2>/dev/null; grew=1 ;; esac
  done
done
kill -KILL $tree 2>/dev/null
kill -CONT $tree 2>/dev/null
rm -f "$f"
exit 0`

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Check refuses a request the wrapper cannot run: an empty argv, or an
// environment variable name that is not a shell identifier.
func Check(req driver.ExecRequest) error {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return errors.New("empty argv")
	}
	for k := range req.Env {
		if !envName.MatchString(k) {
			return fmt.Errorf("environment variable name %q is not a shell identifier", k)
		}
	}
	return nil
}

// Runner runs commands in the Pods of one namespace. It is safe for
// concurrent use.
type Runner struct {
	Config    *rest.Config
	Namespace string
	Log       *slog.Logger

	once sync.Once
	rest rest.Interface
	err  error
}

// Run runs req in container of pod as `sh -c <wrapper> …`: the wrapper
// exports req.Env and execs argv, leaving a PID file
// /tmp/.sbw-exec-<random id> in the cell. When req.Timeout expires, Run
// kills the command and every process still in its tree with a second exec
// and reports TimedOut; when ctx ends first it does the same and returns
// ctx's error. Stdout and stderr are each kept up to req.MaxOutput bytes and
// drained beyond it (Truncated). Zero Timeout and MaxOutput mean
// driver.DefaultExecTimeout and agent.DefaultMaxOutput. Argv and Env
// travel in the exec request's URL and so reach the API server's audit log.
func (r *Runner) Run(ctx context.Context, pod, container string, req driver.ExecRequest) (driver.ExecResult, error) {
	if err := Check(req); err != nil {
		return driver.ExecResult{}, err
	}
	if r.Config == nil {
		return driver.ExecResult{}, errors.New("no REST config: exec needs one")
	}
	timeout, maxOut := req.Limits()
	id := randomID()
	argv := []string{"sh", "-c", execScript, "sbw-exec", id, fmt.Sprint(len(req.Env))}
	for _, k := range slices.Sorted(maps.Keys(req.Env)) {
		argv = append(argv, k+"="+req.Env[k])
	}
	argv = append(argv, req.Argv...)

	stdout, stderr := &capped{max: maxOut}, &capped{max: maxOut}
	var stdin io.Reader
	if len(req.Stdin) > 0 {
		stdin = bytes.NewReader(req.Stdin)
	}
	start := time.Now()
	runCtx, cancel := context.WithTimeout(ctx, timeout)
	err := r.stream(runCtx, pod, container, argv, stdin, stdout, stderr)
	expired := errors.Is(runCtx.Err(), context.DeadlineExceeded)
	cancel()
	res := driver.ExecResult{Duration: time.Since(start)}
	var exitErr utilexec.CodeExitError
	switch {
	case err == nil:
	case errors.As(err, &exitErr):
		res.ExitCode = exitErr.Code
	case ctx.Err() != nil:
		r.kill(ctx, pod, container, id)
		return driver.ExecResult{}, fmt.Errorf("%w (command killed)", ctx.Err())
	case expired:
		res.TimedOut = true
		res.ExitCode = -1
		r.kill(ctx, pod, container, id)
	default:
		// The stream broke: the command may still run.
		r.kill(ctx, pod, container, id)
		return driver.ExecResult{}, err
	}
	res.Stdout, res.Stderr = stdout.bytes(), stderr.bytes()
	res.Truncated = stdout.truncated() || stderr.truncated()
	return res, nil
}

// stream runs argv in the cell container through pods/exec.
func (r *Runner) stream(ctx context.Context, pod, container string, argv []string, stdin io.Reader, stdout, stderr io.Writer) error {
	restClient, err := r.client()
	if err != nil {
		return err
	}
	u := restClient.Post().Namespace(r.Namespace).Resource("pods").Name(pod).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: container,
			Command:   argv,
			Stdin:     stdin != nil,
			Stdout:    true,
			Stderr:    true,
		}, scheme.ParameterCodec).URL()
	spdy, err := remotecommand.NewSPDYExecutor(r.Config, "POST", u)
	if err != nil {
		return err
	}
	// The WebSocket executor must use GET (RFC 6455 §4.1).
	ws, err := remotecommand.NewWebSocketExecutor(r.Config, "GET", u.String())
	if err != nil {
		return err
	}
	exec, err := remotecommand.NewFallbackExecutor(ws, spdy, func(err error) bool {
		return httpstream.IsUpgradeFailure(err) || httpstream.IsHTTPSProxyError(err)
	})
	if err != nil {
		return err
	}
	return exec.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: stderr})
}

// client returns the core/v1 REST client built from Config.
func (r *Runner) client() (rest.Interface, error) {
	r.once.Do(func() {
		cfg := rest.CopyConfig(r.Config)
		cfg.GroupVersion = &corev1.SchemeGroupVersion
		cfg.APIPath = "/api"
		cfg.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
		r.rest, r.err = rest.RESTClientFor(cfg)
	})
	return r.rest, r.err
}

// kill stops the exec's process tree in the cell, best effort: a second
// exec of killScript. It retries once when the command had not yet
// recorded its PID.
func (r *Runner) kill(ctx context.Context, pod, container, id string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), killTimeout)
	defer cancel()
	argv := []string{"sh", "-c", killScript, "sbw-kill", id}
	for attempt := 0; ; attempt++ {
		var out capped
		out.max = 4096
		err := r.stream(ctx, pod, container, argv, nil, &out, &out)
		var exitErr utilexec.CodeExitError
		if errors.As(err, &exitErr) && exitErr.Code == 3 && attempt == 0 {
			time.Sleep(500 * time.Millisecond)
			continue
		}
		if err != nil {
			r.logger().Warn("killing a timed-out exec", "pod", pod, "exec_id", id, "error", err, "output", string(out.bytes()))
		}
		return
	}
}

func randomID() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// capped keeps the first max bytes written and counts the rest.
type capped struct {
	mu      sync.Mutex
	max     int
	buf     bytes.Buffer
	dropped int64
}

func (c *capped) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := c.max - c.buf.Len()
	if room >= len(b) {
		c.buf.Write(b)
	} else {
		c.buf.Write(b[:max(room, 0)])
		c.dropped += int64(len(b) - max(room, 0))
	}
	return len(b), nil
}

func (c *capped) bytes() []byte {
	c.mu.Lock()
	defer c.mu.Unlock()
	return bytes.Clone(c.buf.Bytes())
}

func (c *capped) truncated() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.dropped > 0
}

func (r *Runner) logger() *slog.Logger {
	if r.Log == nil {
		return slog.Default()
	}
	return r.Log
}
