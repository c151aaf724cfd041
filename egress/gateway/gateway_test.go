package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sandboxwich/sandboxwich/egress"
)

// The test's "internet": names resolve to addresses of TEST-NET-3
// (203.0.113.0/24), which the gateway may reach; its Dial redirects them
// to the test's listeners on loopback, and fails the test for any other
// address. Names of the policy that resolve to forbidden addresses show
// that the gateway never dials them.
var names = map[string][]netip.Addr{
	"pkgs.test":    {netip.MustParseAddr("203.0.113.10")},
	"a.files.test": {netip.MustParseAddr("203.0.113.10")},
	"loop.test":    {netip.MustParseAddr("127.0.0.1")},
	"private.test": {netip.MustParseAddr("10.0.0.1")},
	"meta.test":    {netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("fd00:ec2::254")},
	"mapped.test":  {netip.MustParseAddr("::ffff:127.0.0.1")},
	"mixed.test":   {netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("203.0.113.10")},
	"own.test":     {netip.MustParseAddr("203.0.113.99")},
	"evil.test":    {netip.MustParseAddr("203.0.113.10")},
}

type rig struct {
	t     *testing.T
	g     *Gateway
	port  uint16 // the gateway's TCP port, the policy's
	addr  string // the gateway's TCP address
	dns   string // the gateway's DNS address
	stop  func() // stops the gateway and waits for ServeTCP and ServeDNS
	mu    sync.Mutex
	dials []netip.AddrPort
}

// newRig starts a gateway on loopback for a cell at 127.0.0.1 whose
// policy allows every name of names but evil.test, on the gateway's port;
// upstream is where an allowed connection lands.
func newRig(t *testing.T, upstream string) *rig {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, port: uint16(ln.Addr().(*net.TCPAddr).Port), addr: ln.Addr().String(), dns: pc.LocalAddr().String()}
	var list []string
	for n := range names {
		if n != "evil.test" {
			list = append(list, fmt.Sprintf("%s:%d", n, r.port))
		}
	}
	pol, err := egress.Parse(list)
	if err != nil {
		t.Fatal(err)
	}
	r.g, err = New(Config{
		Address: netip.MustParseAddr("192.0.2.53"),
		Lookup: func(src netip.Addr) (Source, bool) {
			return Source{Policy: pol, Key: "lease-1"}, src == netip.MustParseAddr("127.0.0.1")
		},
		Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
			if a, ok := names[host]; ok {
				return a, nil
			}
			return nil, errors.New("no such host")
		},
		Dial: func(ctx context.Context, a netip.AddrPort) (net.Conn, error) {
			r.mu.Lock()
			r.dials = append(r.dials, a)
			r.mu.Unlock()
			if a.Addr() != netip.MustParseAddr("203.0.113.10") {
				t.Errorf("the gateway dialed %s", a)
				return nil, errors.New("not the test's")
			}
			var d net.Dialer
			return d.DialContext(ctx, "tcp", upstream)
		},
		Own:     []netip.Prefix{netip.MustParsePrefix("203.0.113.99/32")},
		Timeout: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, 2)
	go func() { _ = r.g.ServeTCP(ctx, ln); done <- struct{}{} }()
	go func() { _ = r.g.ServeDNS(ctx, pc); done <- struct{}{} }()
	var once sync.Once
	r.stop = func() { once.Do(func() { cancel(); <-done; <-done }) }
	t.Cleanup(r.stop)
	return r
}

func (r *rig) dialed() []netip.AddrPort {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.dials)
}

// get sends a GET over TLS with SNI sni (and Host host) through the
// gateway, returning the body.
func (r *rig) getTLS(sni, host string) (string, error) {
	c, err := tls.Dial("tcp", r.addr, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
	if err != nil {
		return "", err
	}
	defer c.Close()
	return roundTrip(c, host)
}

// getHTTP sends a plain GET with Host host through the gateway.
func (r *rig) getHTTP(host string) (string, error) {
	c, err := net.Dial("tcp", r.addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	return roundTrip(c, host)
}

func roundTrip(c net.Conn, host string) (string, error) {
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := fmt.Fprintf(c, "GET /x HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", host); err != nil {
		return "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func upstream(t *testing.T, tlsOn bool) string {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprintf(w, "hello %s", r.Host) })
	var s *httptest.Server
	if tlsOn {
		s = httptest.NewTLSServer(h)
	} else {
		s = httptest.NewServer(h)
	}
	t.Cleanup(s.Close)
	return s.Listener.Addr().String()
}

// TestGatewayForwardsAllowedTLSAndHTTP: a ClientHello whose SNI is an
// allowed name, and a plain request whose Host is one, reach the name's
// address on the port they came to, through to the answer; both counted
// as allowed.
func TestGatewayForwardsAllowedTLSAndHTTP(t *testing.T) {
	r := newRig(t, upstream(t, true))
	if body, err := r.getTLS("pkgs.test", "pkgs.test"); err != nil || body != "hello pkgs.test" {
		t.Fatalf("TLS to pkgs.test: %q %v", body, err)
	}
	if body, err := r.getTLS("a.files.test.", "a.files.test"); err != nil || body != "hello a.files.test" {
		t.Fatalf("TLS to a.files.test.: %q %v", body, err)
	}
	h := newRig(t, upstream(t, false))
	if body, err := h.getHTTP(fmt.Sprintf("PKGS.test:%d", h.port)); err != nil || body != fmt.Sprintf("hello PKGS.test:%d", h.port) {
		t.Fatalf("HTTP to pkgs.test: %q %v", body, err)
	}
	want := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.10"), r.port)
	if d := r.dialed(); len(d) != 2 || d[0] != want {
		t.Errorf("dials %v, want %s twice", d, want)
	}
	if c := r.g.Counts("lease-1"); c["pkgs.test"] != (Count{Allowed: 1}) || c["a.files.test"] != (Count{Allowed: 1}) {
		t.Errorf("counts %v", c)
	}
	if c := h.g.Counts("lease-1"); c["pkgs.test"] != (Count{Allowed: 1}) {
		t.Errorf("counts %v", c)
	}
	r.g.Forget("lease-1")
	if c := r.g.Counts("lease-1"); len(c) != 0 {
		t.Errorf("counts after Forget: %v", c)
	}
}

// TestGatewayRefuses: names outside the policy, IP literals, other
// protocols, a ClientHello without SNI, silence, and allowed names that
// resolve only to loopback, private, link-local (metadata), mapped or the
// plane's own addresses are refused without a dial (an allowed name with
// one good address among bad ones dials only the good one); each refusal
// is counted under the host the connection named.
func TestGatewayRefuses(t *testing.T) {
	r := newRig(t, upstream(t, true))
	for _, sni := range []string{"evil.test", "loop.test", "private.test", "meta.test", "mapped.test", "own.test", "unknown.test"} {
		if body, err := r.getTLS(sni, sni); err == nil {
			t.Errorf("TLS to %s went through: %q", sni, body)
		}
	}
	if body, err := r.getTLS("", "pkgs.test"); err == nil { // no SNI
		t.Errorf("TLS without SNI went through: %q", body)
	}
	for _, host := range []string{"203.0.113.10", "[::1]", "127.1", "0x7f.1", "evil.test"} {
		if body, err := r.getHTTP(host); err == nil {
			t.Errorf("HTTP with Host %s went through: %q", host, body)
		}
	}
	for _, first := range []string{"SSH-2.0-OpenSSH_9.6\r\n", "\x00\x00\x00\x1agit-upload-pack /x\x00", "\x16\x03\x01\x00\x05hello"} {
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = c.Write([]byte(first))
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if n, err := c.Read(make([]byte, 64)); err == nil {
			t.Errorf("%q: read %d bytes, want the connection closed", first, n)
		}
		c.Close()
	}
	c, err := net.Dial("tcp", r.addr) // silent: closed after the timeout
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var ne net.Error
	if _, err := c.Read(make([]byte, 1)); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Errorf("a silent connection: %v, want it closed by the gateway", err)
	}
	c.Close()
	if d := r.dialed(); len(d) != 0 {
		t.Errorf("refused connections dialed %v", d)
	}
	counts := r.g.Counts("lease-1")
	for h, n := range map[string]int{"evil.test": 2, "loop.test": 1, "private.test": 1, "meta.test": 1, "mapped.test": 1,
		"own.test": 1, "unknown.test": 1, "203.0.113.10": 1, "127.1": 1, "0x7f.1": 1, "[::1]": 1,
		"-": 5} { // no SNI, SSH, git://, a broken ClientHello, silence
		if counts[h] != (Count{Refused: n}) {
			t.Errorf("counts of %s: %+v, want %d refusals", h, counts[h], n)
		}
	}
	// mixed.test resolves to loopback and to a good address: only the
	// good one is dialed.
	if body, err := r.getTLS("mixed.test", "mixed.test"); err != nil || body != "hello mixed.test" {
		t.Fatalf("TLS to mixed.test: %q %v", body, err)
	}
	if d := r.dialed(); len(d) != 1 || d[0].Addr() != netip.MustParseAddr("203.0.113.10") {
		t.Errorf("mixed.test dialed %v", d)
	}
}

// TestGatewayDNS: an A query for an allowed name is answered with the
// gateway's address, an AAAA or TXT query for one with no record, any
// query for another name with NXDOMAIN; a malformed packet gets no answer.
func TestGatewayDNS(t *testing.T) {
	r := newRig(t, upstream(t, true))
	c, err := net.Dial("udp", r.dns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ask := func(name string, typ dnsmessage.Type) (dnsmessage.RCode, []dnsmessage.Resource) {
		t.Helper()
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: 7, RecursionDesired: true})
		_ = b.StartQuestions()
		_ = b.Question(dnsmessage.Question{Name: dnsmessage.MustNewName(name), Type: typ, Class: dnsmessage.ClassINET})
		q, _ := b.Finish()
		if _, err := c.Write(q); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		buf := make([]byte, 512)
		n, err := c.Read(buf)
		if err != nil {
			t.Fatalf("%s %s: %v", name, typ, err)
		}
		var m dnsmessage.Message
		if err := m.Unpack(buf[:n]); err != nil || m.ID != 7 || !m.Response {
			t.Fatalf("%s %s: %+v %v", name, typ, m.Header, err)
		}
		return m.RCode, m.Answers
	}
	rc, ans := ask("pkgs.test.", dnsmessage.TypeA)
	if rc != dnsmessage.RCodeSuccess || len(ans) != 1 || ans[0].Body.(*dnsmessage.AResource).A != [4]byte{192, 0, 2, 53} {
		t.Errorf("A pkgs.test: %v %v, want the gateway's address", rc, ans)
	}
	if rc, ans := ask("X.Files.Test.", dnsmessage.TypeA); rc != dnsmessage.RCodeNameError || len(ans) != 0 {
		t.Errorf("A x.files.test (not listed): %v %v, want NXDOMAIN", rc, ans)
	}
	if rc, ans := ask("a.files.test.", dnsmessage.TypeAAAA); rc != dnsmessage.RCodeSuccess || len(ans) != 0 {
		t.Errorf("AAAA a.files.test: %v %v, want no record", rc, ans)
	}
	if rc, ans := ask("pkgs.test.", dnsmessage.TypeTXT); rc != dnsmessage.RCodeSuccess || len(ans) != 0 {
		t.Errorf("TXT pkgs.test: %v %v, want no record", rc, ans)
	}
	for _, n := range []string{"evil.test.", "exfil-6162636465.evil.test.", "localhost."} {
		for _, typ := range []dnsmessage.Type{dnsmessage.TypeA, dnsmessage.TypeTXT} {
			if rc, ans := ask(n, typ); rc != dnsmessage.RCodeNameError || len(ans) != 0 {
				t.Errorf("%s %s: %v %v, want NXDOMAIN", n, typ, rc, ans)
			}
		}
	}
	_, _ = c.Write([]byte{0, 7, 1, 0, 0, 1})
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 512)); err == nil {
		t.Errorf("a malformed query was answered (%d bytes)", n)
	}
}

// TestForbidden: every range the gateway must never reach is refused
// with a reason; public addresses are not.
func TestForbidden(t *testing.T) {
	for _, a := range []string{"127.0.0.1", "127.255.0.1", "::1", "10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1",
		"100.100.100.200", "169.254.169.254", "fe80::1", "fd00:ec2::254", "fc00::1", "224.0.0.1", "ff02::1",
		"0.0.0.0", "::", "255.255.255.255", "240.0.0.1", "::ffff:10.0.0.1", "64:ff9b::7f00:1", "2002:7f00:1::1", "198.18.0.1"} {
		if Forbidden(netip.MustParseAddr(a)) == "" {
			t.Errorf("%s is not forbidden", a)
		}
	}
	for _, a := range []string{"203.0.113.10", "8.8.8.8", "2606:4700::1111", "::ffff:1.1.1.1"} {
		if why := Forbidden(netip.MustParseAddr(a)); why != "" {
			t.Errorf("%s is forbidden: %s", a, why)
		}
	}
}

// TestGatewayHostile: inputs a hostile cell may send leave the gateway
// serving and dialing nothing — a ClientHello whose SNI is 60 KiB, a
// request trickled a byte at a time (closed once the first-bytes timeout
// passes, however slowly it trickles), a hundred connections that stay
// silent at once, and a burst of garbage DNS packets, after each of which
// an allowed request still goes through.
func TestGatewayHostile(t *testing.T) {
	r := newRig(t, upstream(t, true))
	stillServes := func(after string) {
		t.Helper()
		if body, err := r.getTLS("pkgs.test", "pkgs.test"); err != nil || body != "hello pkgs.test" {
			t.Fatalf("after %s, TLS to pkgs.test: %q %v", after, body, err)
		}
	}
	closed := func(c net.Conn, what string) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		var ne net.Error
		if _, err := c.Read(make([]byte, 1)); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
			t.Errorf("%s: %v, want the connection closed by the gateway", what, err)
		}
	}

	// A ClientHello with a 60 KiB server name (a TLS record holds 16 KiB).
	c, err := net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	huge := strings.Repeat("a", 60<<10)
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write(append([]byte{0x16, 0x03, 0x01, 0xff, 0xff, 0x01, 0x00, 0xff, 0xfb}, huge...))
	closed(c, "a 60 KiB ClientHello")
	c.Close()
	stillServes("a huge ClientHello")

	// Slowloris: one byte every 50 ms of an allowed request never gets
	// past the first-bytes timeout (500 ms here).
	c, err = net.Dial("tcp", r.addr)
	if err != nil {
		t.Fatal(err)
	}
	req := []byte("GET /x HTTP/1.1\r\nHost: pkgs.test\r\nX-Pad: " + strings.Repeat("p", 400) + "\r\n\r\n")
	go func() {
		for _, b := range req {
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	closed(c, "a trickled request") // long before the trickle's 20 s end
	c.Close()

	// A hundred silent connections at once, all closed; then service.
	var conns []net.Conn
	for range 100 {
		c, err := net.Dial("tcp", r.addr)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		closed(c, "one of a hundred silent connections")
		c.Close()
	}
	stillServes("a hundred silent connections")

	// Garbage DNS: empty, short, oversize, a compression loop.
	d, err := net.Dial("udp", r.dns)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	loop := []byte{0, 9, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}
	for _, p := range [][]byte{{}, {1}, make([]byte, 9000), loop, bytes.Repeat([]byte{0xff}, 512)} {
		_, _ = d.Write(p)
	}
	_ = d.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := d.Read(make([]byte, 512)); err == nil {
		t.Errorf("garbage DNS was answered (%d bytes)", n)
	}
	stillServes("garbage DNS")
	if got := r.dialed(); len(got) != 3 {
		t.Errorf("the gateway dialed %v, want only the three allowed requests", got)
	}
}
