package postgres_test

import (
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/testpg"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/postgres"
)

// TestUnreachableIsStoreUnavailable: with the database cut off (the TCP
// path to it closed, every connection dropped), a write fails with
// store_unavailable (503, retried by clients), not an internal error;
// once the path is back the same write commits, through new connections.
func TestUnreachableIsStoreUnavailable(t *testing.T) {
	u, err := url.Parse(testpg.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	px := newCutProxy(t, u.Host)
	u.Host = px.addr
	s := open(t, u.String(), postgres.Options{})
	defer s.Close()
	p := store.PrepareParams{CellID: uuid.Must(uuid.NewV7()), TenantID: "acme", WorkerID: uuid.NewString(), ProviderCellID: "p-1",
		Release: lease.Release{ReleaseSetID: "rel", RuntimeClass: lease.KataMicroVM, PolicyDigest: strings.Repeat("ab", 32),
			Signature: strings.Repeat("s", 64)},
		ExpiresAt: time.Now().Add(time.Hour)}
	if _, err := s.Prepare(t.Context(), p); err != nil {
		t.Fatal(err)
	}
	px.cut()
	p.CellID, p.ProviderCellID = uuid.Must(uuid.NewV7()), "p-2"
	if _, err := s.Prepare(t.Context(), p); !errors.Is(err, errcode.ErrStoreUnavailable) {
		t.Fatalf("a write with the database cut off: %v, want store_unavailable", err)
	}
	if err := s.Ping(t.Context()); err == nil {
		t.Fatal("Ping succeeded with the database cut off")
	}
	px.heal()
	if _, err := s.Prepare(t.Context(), p); err != nil {
		t.Fatalf("the same write once the database is back: %v", err)
	}
}

// cutProxy forwards TCP to a target until cut, which closes the listener
// and every connection; heal listens again on the same address.
type cutProxy struct {
	t      *testing.T
	addr   string
	target string
	mu     sync.Mutex
	ln     net.Listener
	conns  []net.Conn
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	p := &cutProxy{t: t, target: target, addr: "127.0.0.1:0"}
	p.heal()
	p.addr = p.ln.Addr().String()
	t.Cleanup(p.cut)
	return p
}

func (p *cutProxy) heal() {
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", p.target)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(up, c); up.Close() }()
			go func() { _, _ = io.Copy(c, up); c.Close() }()
		}
	}()
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}
