package gvisor

import (
	"archive/zip"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/pem"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/lease"
)

// testInternet is what the gateway of a test reaches: names resolve to
// documentation addresses (or to loopback, for a name that must be
// refused after resolving), and every connection the gateway allowed lands
// on a server of the test — HTTPS for port 443 (a certificate for
// example.com), HTTP otherwise — which answers with the Host it was asked
// for. Nothing leaves the machine.
type testInternet struct {
	srv, tls *httptest.Server
	mu       sync.Mutex
	dialed   []netip.AddrPort
}

func newTestInternet(t *testing.T) *testInternet {
	in := &testInternet{}
	wheel := demoWheel(t)
	sum := sha256.Sum256(wheel)
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello from %s", r.Host) })
	// A package index (PEP 503) of one project, sbwdemo, and its wheel.
	mux.HandleFunc("/simple/sbwdemo/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<html><body><a href="/files/%s#sha256=%x">%s</a></body></html>`, demoWheelName, sum, demoWheelName)
	})
	mux.HandleFunc("/files/"+demoWheelName, func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write(wheel) })
	in.srv, in.tls = httptest.NewServer(mux), httptest.NewTLSServer(mux)
	t.Cleanup(in.srv.Close)
	t.Cleanup(in.tls.Close)
	return in
}

const demoWheelName = "sbwdemo-1.0-py3-none-any.whl"

// demoWheel is a real wheel of a one-module project, sbwdemo 1.0, whose
// HELLO says where it came from.
func demoWheel(t *testing.T) []byte {
	files := []struct{ name, body string }{
		{"sbwdemo/__init__.py", "HELLO = \"installed through the egress gateway\"\n"},
		{"sbwdemo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: sbwdemo\nVersion: 1.0\n"},
		{"sbwdemo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: sandboxwich-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, f := range files {
		w, err := zw.Create(f.name)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = w.Write([]byte(f.body))
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	record.WriteString("sbwdemo-1.0.dist-info/RECORD,,\n")
	w, err := zw.Create("sbwdemo-1.0.dist-info/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// caPEM is the certificate a client of the HTTPS server trusts.
func (in *testInternet) caPEM() string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: in.tls.Certificate().Raw}))
}

func (in *testInternet) resolve(_ context.Context, host string) ([]netip.Addr, error) {
	switch host {
	case "pkgs.test":
		return []netip.Addr{netip.MustParseAddr("203.0.113.7")}, nil
	case "example.com":
		return []netip.Addr{netip.MustParseAddr("203.0.113.8")}, nil
	case "loop.test":
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

func (in *testInternet) dial(ctx context.Context, ap netip.AddrPort) (net.Conn, error) {
	in.mu.Lock()
	in.dialed = append(in.dialed, ap)
	in.mu.Unlock()
	srv := in.srv
	if ap.Port() == 443 {
		srv = in.tls
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", srv.Listener.Addr().String())
}

// newTestEgressNet is an egress net of a name of its own, whose gateway
// namespace is removed at cleanup.
func newTestEgressNet(t *testing.T, ctx context.Context, in *testInternet, state string) *EgressNet {
	t.Helper()
	name := "t" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12]
	n, err := NewEgressNet(ctx, EgressConfig{Name: name, StateDir: state, Ports: []uint16{80, 443},
		Resolve: in.resolve, Dial: in.dial})
	if err != nil {
		t.Fatalf("NewEgressNet: %v", err)
	}
	t.Cleanup(func() {
		if err := n.Remove(context.Background()); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	return n
}

// cellProbe runs in a cell: what DNS, HTTP through the gateway and direct
// connections give. One line each.
const cellProbe = `
import socket, ssl, urllib.request
def line(f):
    try:
        print(f())
    except Exception as e:
        print("error:", type(e).__name__)
line(lambda: socket.gethostbyname("pkgs.test"))
line(lambda: socket.gethostbyname("evil.test"))
line(lambda: urllib.request.urlopen("http://pkgs.test/simple/", timeout=10).read().decode())
line(lambda: urllib.request.urlopen("http://loop.test/", timeout=10).read().decode())
line(lambda: urllib.request.urlopen("https://example.com/", timeout=10, context=ssl.create_default_context(cadata="""%s""")).read().decode())
def connect(addr):
    s = socket.socket()
    s.settimeout(5)
    return s.connect_ex(addr)
line(lambda: connect(("10.0.0.1", 80)))
line(lambda: connect(("%[2]s", 22)))
`

// TestEgressCell (CONTRACT §22): a cell of an egress net resolves only
// the names its policy allows (to the gateway), reaches an allowed name
// over HTTP through the gateway, is refused a name that resolves to
// loopback, has no route to any other address and finds nothing else on
// the gateway's address; pip installs a real wheel from a package index
// over TLS through the gateway; the counts say so. Narrowed to none, it reaches
// nothing. Its destruction removes its namespace and record.
func TestEgressCell(t *testing.T) {
	requireRunsc(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	in := newTestInternet(t)
	cfg := testConfig(t)
	n := newTestEgressNet(t, ctx, in, t.TempDir())
	cfg.Egress = n
	p := newProvider(t, cfg)
	if !p.Capabilities().Egress {
		t.Fatal("a provider with an egress net does not report Egress")
	}
	pol, err := egress.Parse([]string{"pkgs.test:80", "loop.test:80", "example.com:443"})
	if err != nil {
		t.Fatal(err)
	}
	cellID := uuid.Must(uuid.NewV7())
	obj, err := p.Provision(ctx, driver.ProvisionRequest{CellID: cellID, RuntimeClass: lease.GVisorLowerRisk, Egress: pol})
	if err != nil {
		t.Fatalf("Provision: %v", err)
	}
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			_ = p.Destroy(context.Background(), obj)
		}
	})
	c := activate(t, p, obj)
	var rp []byte
	if err := inNetNS(nsPath(n.gatewayNS()), func() (err error) {
		rp, err = os.ReadFile("/proc/sys/net/ipv4/conf/all/rp_filter")
		return err
	}); err != nil || strings.TrimSpace(string(rp)) != "1" {
		t.Errorf("the gateway namespace's rp_filter: %q %v, want 1 (strict)", rp, err)
	}
	probe := func() []string {
		res := c.runAs(t, agent.UserRoot, "python3", "-c", fmt.Sprintf(cellProbe, in.caPEM(), n.cfg.Address))
		return strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")
	}
	got := probe()
	want := []string{n.cfg.Address.String(), "error: gaierror", "hello from pkgs.test", "error: RemoteDisconnected",
		"hello from example.com", "101", "111"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("the cell's probe:\n got %q\nwant %q", got, want)
	}
	// pip installs a real wheel from the package index on example.com,
	// over TLS through the gateway.
	pip := c.runAs(t, agent.UserRoot, "sh", "-c", "cat > /tmp/ca.pem <<'EOF'\n"+in.caPEM()+"EOF\n"+
		"python3 -m pip install --quiet --disable-pip-version-check --no-cache-dir --no-deps --cert /tmp/ca.pem"+
		" --index-url https://example.com/simple/ --target /tmp/pkgs sbwdemo &&"+
		" PYTHONPATH=/tmp/pkgs python3 -c 'import sbwdemo; print(sbwdemo.HELLO)'")
	if got := strings.TrimSpace(string(pip.Stdout)); pip.ExitCode != 0 || got != "installed through the egress gateway" {
		t.Errorf("pip install from the index through the gateway: exit %d, %q %q", pip.ExitCode, got, pip.Stderr)
	}
	in.mu.Lock()
	dialed := slices.Compact(append([]netip.AddrPort(nil), in.dialed...))
	in.mu.Unlock()
	if want := []netip.AddrPort{netip.MustParseAddrPort("203.0.113.7:80"), netip.MustParseAddrPort("203.0.113.8:443")}; !slices.Equal(dialed, want) {
		t.Errorf("the gateway dialed %v, want only %v (pkgs.test over HTTP, example.com over TLS)", dialed, want)
	}
	counts := p.EgressCounts(obj)
	if counts["pkgs.test"] != (driver.EgressCount{Allowed: 1}) || counts["example.com"].Allowed < 2 ||
		counts["loop.test"].Refused != 1 {
		t.Errorf("the cell's counts: %+v, want pkgs.test allowed once, example.com for the probe and for pip (one kept-alive connection or more), loop.test refused", counts)
	}

	if err := p.SetEgress(ctx, obj, egress.None); err != nil {
		t.Fatalf("SetEgress none: %v", err)
	}
	if got := probe(); got[0] != "error: gaierror" || got[2] == "hello from pkgs.test" || got[4] == "hello from example.com" {
		t.Errorf("the cell's probe narrowed to none: %q, want pkgs.test refused", got)
	}

	n.mu.Lock()
	addr := n.byCell[cellID].addr
	n.mu.Unlock()
	if err := p.Destroy(ctx, obj); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	destroyed = true
	if nsExists(n.addrNS(addr)) {
		t.Error("the cell's namespace outlived it")
	}
	if _, err := os.Stat(n.stateFile(cellID)); !os.IsNotExist(err) {
		t.Errorf("the cell's record outlived it: %v", err)
	}
	if _, ok := n.lookup(addr); ok {
		t.Error("the gateway still knows the cell's address")
	}
}

// TestEgressNetRestart: a restarted egress net (a new process, the same
// name and state) adopts the namespace of a live cell with its address and
// policy, and removes a namespace of its name that no record holds.
func TestEgressNetRestart(t *testing.T) {
	requireRoot(t)
	in := newTestInternet(t)
	state := t.TempDir()
	ctx1, cancel1 := context.WithCancel(context.Background())
	n1, err := NewEgressNet(ctx1, EgressConfig{Name: "t" + strings.ReplaceAll(uuid.NewString(), "-", "")[:12], StateDir: state,
		Resolve: in.resolve, Dial: in.dial})
	if err != nil {
		t.Fatal(err)
	}
	live := uuid.New()
	pol, _ := egress.Parse([]string{"pkgs.test"})
	if _, err := n1.Attach(ctx1, live, pol); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	stray := n1.addrNS(netip.MustParseAddr("100.64.9.9"))
	if err := ipBatch(ctx1, "", "netns add "+stray); err != nil {
		t.Fatal(err)
	}
	addr := n1.byCell[live].addr
	cancel1() // the process ends: its sockets close, the namespaces stay
	<-n1.made

	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	n2, err := NewEgressNet(ctx2, n1.cfg)
	if err != nil {
		t.Fatalf("NewEgressNet again: %v", err)
	}
	t.Cleanup(func() {
		_ = n2.Detach(context.Background(), live)
		cancel2()
		if err := n2.Remove(context.Background()); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	src, ok := n2.lookup(addr)
	if !ok || src.Key != live.String() || src.Policy.Canonical() != pol.Canonical() {
		t.Errorf("the adopted cell: %+v %v, want cell %s with %q", src, ok, live, pol.Canonical())
	}
	if nsExists(stray) {
		t.Error("a namespace no record holds survived the restart")
	}
	if err := n2.Detach(ctx2, live); err != nil || nsExists(n2.addrNS(addr)) {
		t.Errorf("Detach: %v (namespace left: %v)", err, nsExists(n2.addrNS(addr)))
	}
}
