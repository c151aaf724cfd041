// Package gateway is the egress gateway of CONTRACT §22: the one place a
// cell of an allow-list pool can send packets to. It answers the cell's DNS
// queries and proxies its TCP connections, and it lets through only what
// the cell's egress policy allows:
//
//   - DNS: an A query for a name the policy allows (on any port) is
//     answered with the gateway's own address, so every connection of the
//     cell comes to the gateway; an AAAA or other query for such a name is
//     answered with no record; any other name is NXDOMAIN. The gateway
//     never recurses for a cell, so a query cannot carry data out.
//   - TCP: a connection must open with a TLS ClientHello whose SNI names an
//     allowed host, or with an HTTP/1 request whose Host names one, on the
//     port the connection came to. Everything else (SSH, git://, a
//     ClientHello without SNI, an IP literal — which egress.Policy.Allows
//     never allows — a request the allowed name does not match) is refused: the connection is closed and nothing is
//     sent anywhere.
//   - The gateway resolves an allowed name itself and connects only to
//     addresses that are none of loopback, private (RFC 1918, RFC 6598,
//     ULA), link-local (cloud metadata among them), multicast, unspecified,
//     reserved, or the plane's own (Config.Own), checked after resolution
//     and again as the socket connects: a name that resolves to such an
//     address is refused, so DNS rebinding gets nowhere.
//
// Per cell (Source.Key, a lease ID) it counts the connections allowed and
// refused by host. It logs hosts and reasons only: no path, header, body
// or query of a request is logged or kept.
//
// The gateway does not make network namespaces or routes: a driver gives
// each cell a route to the gateway's address only, and Config.Lookup tells
// the gateway which cell an address is.
package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/net/dns/dnsmessage"

	"github.com/sandboxwich/sandboxwich/egress"
)

// Source is what the gateway knows of the cell a packet comes from: its
// effective policy and the key its counts are kept under.
type Source struct {
	Policy egress.Policy
	Key    string
}

// Config configures a Gateway.
type Config struct {
	// Address is the gateway's address as the cells reach it: the answer
	// to their A queries. Required (IPv4).
	Address netip.Addr
	// Lookup returns the cell a source address belongs to; false refuses
	// the packet. Required.
	Lookup func(src netip.Addr) (Source, bool)
	// Resolve resolves an allowed name (default: the host's resolver,
	// net.DefaultResolver.LookupNetIP).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	// Dial connects to an address the gateway checked (default a
	// net.Dialer that checks it again as the socket connects). Tests
	// redirect it to their listeners.
	Dial func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
	// Own are the plane's own addresses, never connected to.
	Own []netip.Prefix
	// Timeout bounds reading a connection's first bytes, resolving and
	// connecting (default 10 s).
	Timeout time.Duration
	// Logger receives one line per refused connection (host and reason).
	Logger *slog.Logger
}

// Count is how many connections of a cell to a host were allowed and
// refused.
type Count struct {
	Allowed, Refused int
}

// Gateway answers the DNS queries and proxies the connections of cells.
// Its methods are safe for concurrent use.
type Gateway struct {
	cfg    Config
	mu     sync.Mutex
	counts map[string]map[string]*Count // key → host → count
}

// New returns a Gateway, or an error naming the missing setting.
func New(cfg Config) (*Gateway, error) {
	switch {
	case !cfg.Address.Is4():
		return nil, errors.New("gateway: Config.Address must be an IPv4 address")
	case cfg.Lookup == nil:
		return nil, errors.New("gateway: Config.Lookup is required")
	}
	if cfg.Resolve == nil {
		cfg.Resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	g := &Gateway{counts: map[string]map[string]*Count{}}
	if cfg.Dial == nil {
		cfg.Dial = g.dial
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	g.cfg = cfg
	return g, nil
}

// Counts returns the counts of the cell whose Source.Key is key, by host.
func (g *Gateway) Counts(key string) map[string]Count {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]Count{}
	for h, c := range g.counts[key] {
		out[h] = *c
	}
	return out
}

// Forget drops the counts of key (its lease ended and its counts were
// read).
func (g *Gateway) Forget(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.counts, key)
}

// count records a connection of key to host; host is "" when the
// connection named none (counted under "-").
func (g *Gateway) count(key, host string, allowed bool) {
	if host == "" {
		host = "-"
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	m := g.counts[key]
	if m == nil {
		m = map[string]*Count{}
		g.counts[key] = m
	}
	c := m[host]
	if c == nil {
		c = &Count{}
		m[host] = c
	}
	if allowed {
		c.Allowed++
	} else {
		c.Refused++
	}
}

// maxDNS is the largest DNS message read or written (over UDP, without
// EDNS, 512 bytes; a query is far smaller).
const maxDNS = 512

// ServeDNS answers DNS queries on pc until ctx ends or pc fails.
func (g *Gateway) ServeDNS(ctx context.Context, pc net.PacketConn) error {
	stop := context.AfterFunc(ctx, func() { _ = pc.Close() })
	defer stop()
	buf := make([]byte, maxDNS)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		ap, ok := addrOf(from)
		if !ok {
			continue
		}
		src, ok := g.cfg.Lookup(ap.Addr())
		if !ok {
			continue // not a cell's: no answer
		}
		if resp, ok := g.answer(src, buf[:n]); ok {
			_, _ = pc.WriteTo(resp, from)
		}
	}
}

// answer builds the reply to one query of src, or false for a message
// that is not one query (dropped, as a malformed packet is).
func (g *Gateway) answer(src Source, msg []byte) ([]byte, bool) {
	var p dnsmessage.Parser
	h, err := p.Start(msg)
	if err != nil || h.Response {
		return nil, false
	}
	qs, err := p.AllQuestions()
	if err != nil || len(qs) != 1 {
		return nil, false
	}
	q := qs[0]
	rh := dnsmessage.Header{ID: h.ID, Response: true, OpCode: h.OpCode, RecursionDesired: h.RecursionDesired,
		Authoritative: true}
	name := strings.TrimSuffix(q.Name.String(), ".")
	switch {
	case h.OpCode != 0 || q.Class != dnsmessage.ClassINET:
		rh.RCode = dnsmessage.RCodeNotImplemented
	case !src.Policy.AllowsName(name):
		rh.RCode = dnsmessage.RCodeNameError // NXDOMAIN; nothing is asked upstream
	}
	b := dnsmessage.NewBuilder(make([]byte, 0, maxDNS), rh)
	b.EnableCompression()
	if b.StartQuestions() != nil || b.Question(q) != nil || b.StartAnswers() != nil {
		return nil, false
	}
	if rh.RCode == dnsmessage.RCodeSuccess && q.Type == dnsmessage.TypeA {
		err := b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 60},
			dnsmessage.AResource{A: g.cfg.Address.As4()})
		if err != nil {
			return nil, false
		}
	}
	out, err := b.Finish()
	return out, err == nil
}

// ServeTCP proxies the connections accepted on ln until ctx ends or ln
// fails, and returns once every connection it accepted is closed (when ctx
// ends, at once). The port they came to is the port the policy is asked
// about and the port connected to.
func (g *Gateway) ServeTCP(ctx context.Context, ln net.Listener) error {
	stop := context.AfterFunc(ctx, func() { _ = ln.Close() })
	defer stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		wg.Go(func() { g.serveConn(ctx, c) })
	}
}

// serveConn proxies one connection, or refuses it. When ctx ends (the
// gateway stops) the connection is closed, both ways: none outlives it.
func (g *Gateway) serveConn(ctx context.Context, c net.Conn) {
	defer c.Close()
	defer context.AfterFunc(ctx, func() { _ = c.Close() })()
	from, ok := addrOf(c.RemoteAddr())
	local, lok := addrOf(c.LocalAddr())
	if !ok || !lok {
		return
	}
	src, ok := g.cfg.Lookup(from.Addr())
	if !ok {
		return
	}
	up, prefix, host, err := g.open(ctx, c, src, local.Port())
	if err != nil {
		g.count(src.Key, host, false)
		g.cfg.Logger.Info("egress refused", "key", src.Key, "host", host, "port", local.Port(), "reason", err.Error())
		return
	}
	g.count(src.Key, host, true)
	defer up.Close()
	defer context.AfterFunc(ctx, func() { _ = up.Close() })()
	if _, err := up.Write(prefix); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, c)
		closeWrite(up)
	}()
	_, _ = io.Copy(c, up)
	closeWrite(c)
	<-done
}

// open reads the connection's first bytes, decides, and connects
// upstream: it returns the upstream connection, the bytes read (to be sent
// first) and the host the connection named.
func (g *Gateway) open(ctx context.Context, c net.Conn, src Source, port uint16) (net.Conn, []byte, string, error) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	_ = c.SetReadDeadline(time.Now().Add(g.cfg.Timeout))
	host, prefix, err := sniff(c)
	_ = c.SetReadDeadline(time.Time{})
	if err != nil {
		return nil, nil, host, err
	}
	host = strings.TrimSuffix(strings.ToLower(host), ".")
	switch {
	case host == "":
		return nil, nil, "", errors.New("the connection names no host")
	case !src.Policy.Allows(host, port):
		return nil, nil, host, errors.New("the policy does not allow " + host + ":" + strconv.Itoa(int(port)))
	}
	addrs, err := g.cfg.Resolve(ctx, host)
	if err != nil {
		return nil, nil, host, fmt.Errorf("resolving: %w", err)
	}
	var lastErr error = errors.New(host + " resolves to no address")
	for _, a := range addrs {
		if why := g.forbidden(a); why != "" {
			lastErr = errors.New(host + " resolves to " + a.String() + ", " + why)
			continue
		}
		up, err := g.cfg.Dial(ctx, netip.AddrPortFrom(a.Unmap(), port))
		if err == nil {
			return up, prefix, host, nil
		}
		lastErr = err
	}
	return nil, nil, host, lastErr
}

// dial connects to an address open checked, checking it again as the
// socket connects.
func (g *Gateway) dial(ctx context.Context, addr netip.AddrPort) (net.Conn, error) {
	d := net.Dialer{Control: func(_, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return err
		}
		if why := g.forbidden(ap.Addr()); why != "" {
			return fmt.Errorf("gateway: %s is %s", ap.Addr(), why)
		}
		return nil
	}}
	return d.DialContext(ctx, "tcp", addr.String())
}

// forbidden returns why the gateway never connects to a, or "".
func (g *Gateway) forbidden(a netip.Addr) string {
	if why := Forbidden(a); why != "" {
		return why
	}
	for _, p := range g.cfg.Own {
		if p.Contains(a.Unmap()) {
			return "the plane's own address"
		}
	}
	return ""
}

// blocked are the ranges Forbidden refuses beyond what netip.Addr's
// predicates name.
var blocked = []struct {
	prefix netip.Prefix
	why    string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "reserved (this network)"},
	{netip.MustParsePrefix("100.64.0.0/10"), "private (shared address space, RFC 6598)"},
	{netip.MustParsePrefix("192.0.0.0/24"), "reserved (IETF protocol assignments)"},
	{netip.MustParsePrefix("198.18.0.0/15"), "reserved (benchmarking)"},
	{netip.MustParsePrefix("240.0.0.0/4"), "reserved"},
	{netip.MustParsePrefix("64:ff9b::/96"), "a NAT64 address (it embeds an IPv4 one)"},
	{netip.MustParsePrefix("64:ff9b:1::/48"), "a NAT64 address (it embeds an IPv4 one)"},
	{netip.MustParsePrefix("2002::/16"), "a 6to4 address (it embeds an IPv4 one)"},
	{netip.MustParsePrefix("2001::/32"), "a Teredo address (it embeds an IPv4 one)"},
	{netip.MustParsePrefix("100::/64"), "reserved (discard)"},
}

// Forbidden returns why a is an address no cell may reach through the
// gateway — loopback, private, link-local (cloud metadata services among
// them), multicast, unspecified, broadcast or reserved — or "" for an
// address it may.
func Forbidden(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return "not an address"
	case a.Zone() != "":
		return "a scoped address"
	case a.IsLoopback():
		return "loopback"
	case a.IsPrivate():
		return "private"
	case a.IsLinkLocalUnicast():
		return "link-local (metadata services live there)"
	case a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "multicast"
	case a.IsUnspecified():
		return "unspecified"
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "broadcast"
	}
	for _, b := range blocked {
		if b.prefix.Contains(a) {
			return b.why
		}
	}
	return ""
}

// maxSniff bounds the bytes read before the gateway decides: a ClientHello
// (at most a few records) or an HTTP request's header.
const maxSniff = 64 << 10

// sniff reads the first bytes of c and returns the host they name — a
// TLS ClientHello's SNI, or an HTTP/1 request's Host without its port —
// and the bytes read.
func sniff(c net.Conn) (host string, read []byte, err error) {
	var buf bytes.Buffer
	r := bufio.NewReader(io.TeeReader(io.LimitReader(c, maxSniff), &buf))
	first, err := r.Peek(1)
	if err != nil {
		return "", nil, errors.New("no bytes before the deadline")
	}
	if first[0] == 0x16 { // a TLS handshake record
		host, err = clientHelloSNI(r)
		if err != nil {
			return "", nil, err
		}
		return host, buf.Bytes(), nil
	}
	req, err := http.ReadRequest(r)
	if err != nil {
		return "", nil, errors.New("neither TLS nor an HTTP/1 request (only those are forwarded)")
	}
	// The port asked about, and connected to, is the one the connection
	// came to, whatever the Host header says.
	host = req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	// Every byte read from c (the header, and whatever r read past it) is
	// sent upstream first, as the cell sent it.
	return host, buf.Bytes(), nil
}

// errSNI stops the TLS handshake once the ClientHello was read.
var errSNI = errors.New("client hello read")

// clientHelloSNI parses the ClientHello r starts with, through the TLS
// library's own parser, and returns its server name ("" for none).
func clientHelloSNI(r io.Reader) (string, error) {
	var sni string
	var hello bool
	err := tls.Server(readOnly{r: r}, &tls.Config{GetConfigForClient: func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		sni, hello = h.ServerName, true
		return nil, errSNI
	}}).Handshake()
	if !hello {
		return "", fmt.Errorf("not a TLS ClientHello: %v", err)
	}
	return sni, nil
}

// readOnly is a net.Conn that reads r and writes nowhere, for
// clientHelloSNI: the TLS library's alert on the aborted handshake goes
// nowhere.
type readOnly struct {
	net.Conn
	r io.Reader
}

func (c readOnly) Read(p []byte) (int, error)       { return c.r.Read(p) }
func (c readOnly) Write(p []byte) (int, error)      { return len(p), nil }
func (c readOnly) Close() error                     { return nil }
func (c readOnly) SetDeadline(time.Time) error      { return nil }
func (c readOnly) SetReadDeadline(time.Time) error  { return nil }
func (c readOnly) SetWriteDeadline(time.Time) error { return nil }
func (c readOnly) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c readOnly) RemoteAddr() net.Addr             { return &net.TCPAddr{} }

// addrOf returns a net.Addr's address and port.
func addrOf(a net.Addr) (netip.AddrPort, bool) {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.AddrPort(), true
	case *net.UDPAddr:
		return a.AddrPort(), true
	}
	ap, err := netip.ParseAddrPort(a.String())
	return ap, err == nil
}

// closeWrite half-closes c when it can, else closes it.
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		return
	}
	_ = c.Close()
}
