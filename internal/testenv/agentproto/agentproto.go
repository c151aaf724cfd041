// Package agentproto puts the real cell-agent protocol between the plane
// and the fake agent: a [Provider] is a fake.AgentProvider whose every
// cell's agent is served by agent.NewHandler on a loopback listener and
// reached through agent.Client — the HTTP form, content frames, aborted bodies
// and all — as the gVisor and Kubernetes drivers reach the real agent.
//
// Content of more than [KeepBytes] is not kept by the fake (which holds
// files in memory): it is hashed as it streams and recorded, only once the
// content ended cleanly, as a [Large] file, so that tests can send files
// of hundreds of MiB.
package agentproto

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httptest"
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
)

// KeepBytes is the largest content the fake agent keeps; larger files are
// recorded as Large.
const KeepBytes = 1 << 20

// Provider is a fake.AgentProvider reached through the agent protocol.
type Provider struct {
	*fake.AgentProvider
	tb testing.TB

	mu      sync.Mutex
	clients map[uuid.UUID]*agent.Client
	large   map[string]agent.FileInfo
}

var _ driver.AgentHost = (*Provider)(nil)

// New wraps p; the servers it starts stop when tb ends.
func New(tb testing.TB, p *fake.AgentProvider) *Provider {
	return &Provider{AgentProvider: p, tb: tb, clients: map[uuid.UUID]*agent.Client{}, large: map[string]agent.FileInfo{}}
}

// Agent implements driver.AgentHost: an agent.Client of the cell's fake
// agent, served over HTTP.
func (p *Provider) Agent(ctx context.Context, obj driver.Object) (agent.Conn, error) {
	c, err := p.AgentProvider.Agent(ctx, obj)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cl, ok := p.clients[obj.CellID]; ok {
		return cl, nil
	}
	srv := httptest.NewServer(agent.NewHandler(&keeper{Conn: c, p: p}))
	p.tb.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	cl := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", addr)
	})
	p.tb.Cleanup(cl.CloseIdleConnections)
	p.clients[obj.CellID] = cl
	return cl, nil
}

// Large reports the file of more than KeepBytes last written at path, if
// a write of one completed.
func (p *Provider) Large(path string) (agent.FileInfo, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fi, ok := p.large[path]
	return fi, ok
}

// keeper is the fake agent behind the handler, with large content hashed
// instead of kept.
type keeper struct {
	agent.Conn
	p *Provider
}

// WriteFile hands content of at most KeepBytes to the fake agent; more is
// hashed as it streams and recorded only at its clean end (io.EOF).
// Either way, content that fails writes nothing.
func (k *keeper) WriteFile(ctx context.Context, req agent.WriteRequest, content io.Reader) (agent.FileInfo, error) {
	head, err := io.ReadAll(io.LimitReader(content, KeepBytes+1))
	if err != nil {
		return agent.FileInfo{}, fmt.Errorf("agentproto: reading the content: %w", err)
	}
	if len(head) <= KeepBytes {
		return k.Conn.WriteFile(ctx, req, bytes.NewReader(head))
	}
	if req.Activation != nil {
		if err := k.Activate(ctx, *req.Activation); err != nil {
			return agent.FileInfo{}, err
		}
	}
	h := sha256.New()
	h.Write(head)
	n, err := io.Copy(h, io.LimitReader(content, agent.MaxFileBytes+1-int64(len(head))))
	switch size := n + int64(len(head)); {
	case err != nil:
		return agent.FileInfo{}, fmt.Errorf("agentproto: reading the content: %w", err)
	case size > agent.MaxFileBytes:
		return agent.FileInfo{}, agent.Errorf(agent.CodeTooLarge, "more than 256 MiB")
	default:
		fi := agent.FileInfo{Path: req.Path, Size: size, SHA256: hex.EncodeToString(h.Sum(nil))}
		k.p.mu.Lock()
		k.p.large[req.Path] = fi
		k.p.mu.Unlock()
		return fi, nil
	}
}

// ReadFile refuses a file recorded as Large (its bytes were not kept).
func (k *keeper) ReadFile(ctx context.Context, req agent.ReadRequest) (io.ReadCloser, int64, error) {
	if _, ok := k.p.Large(req.Path); ok {
		return nil, 0, errors.New("agentproto: a large file's bytes are not kept")
	}
	return k.Conn.ReadFile(ctx, req)
}
