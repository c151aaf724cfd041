package httpapi

import (
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/sandboxwich/sandboxwich/agent"
)

// TestMaxRequestsPerPrincipal: with a cap of N requests in flight per
// token, the token's next request is 429 too_many_requests with
// Retry-After while N are held open; another token is unaffected; once
// one ends, the token is served again.
//
// The held requests are file writes that the cell's agent holds: the test
// knows they are in flight when the agent has them, so no probe of its
// own can take a slot first (as a probe sent while the held requests were
// still on their way did on a loaded machine).
func TestMaxRequestsPerPrincipal(t *testing.T) {
	const limit = 2
	a := newAgentEnv(t, backends[0], 1, func(c *Config) { c.MaxRequestsPerPrincipal = limit })
	c := a.lease()
	arrived, release := make(chan struct{}), make(chan struct{})
	a.prov.setHook(&connHook{write: func(ctx context.Context, req agent.WriteRequest, content io.Reader) (agent.FileInfo, error) {
		n, err := io.Copy(io.Discard, content)
		if err != nil {
			return agent.FileInfo{}, err
		}
		arrived <- struct{}{}
		select {
		case <-release:
		case <-ctx.Done():
			return agent.FileInfo{}, ctx.Err()
		}
		return agent.FileInfo{Path: req.Path, Size: n}, nil
	}})
	var wg sync.WaitGroup
	statuses := make(chan int, limit)
	for i := range limit {
		wg.Go(func() {
			statuses <- a.upload(c, map[string]any{"path": "/held" + string(rune('0'+i))}, strings.NewReader("x")).status
		})
	}
	for range limit {
		<-arrived
	}
	inventory := func(token string) resp { return a.do("GET", "/v1/sterile-cells/inventory", token, nil) }
	r := inventory(tokAcme)
	r.errCode(t, 429, "too_many_requests")
	if ra := r.header.Get("Retry-After"); ra == "" {
		t.Error("a 429 without Retry-After")
	}
	inventory(tokGlobex).must(t, 200)
	release <- struct{}{}
	if s := <-statuses; s != http.StatusOK {
		t.Errorf("a held write answered %d, want 200", s)
	}
	inventory(tokAcme).must(t, 200)
	close(release)
	wg.Wait()
	if s := <-statuses; s != http.StatusOK {
		t.Errorf("a held write answered %d, want 200", s)
	}
}

// TestOpenAPITooManyRequests: every route that takes a token documents
// the 429 of the in-flight cap.
func TestOpenAPITooManyRequests(t *testing.T) {
	d := loadDoc(t)
	for _, rt := range routes {
		if rt.access == accessProbe || rt.access == accessPublic {
			continue
		}
		if op := d.Paths.Find(rt.path).GetOperation(rt.method); op.Responses.Value("429") == nil {
			t.Errorf("%s does not document 429 too_many_requests", rt.pattern())
		}
	}
}
