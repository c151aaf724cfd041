// Package testserver runs the real server — httpapi over a Plane with one
// pool over SQLite — behind an httptest.Server, for the tests of the
// packages that speak to it over HTTP (client, cmd/sandboxwich). It is
// apart from testenv because it imports httpapi, whose own tests use
// testenv.
package testserver

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// The server's principals and its pool.
const (
	Tenant        = "acme"
	TenantToken   = "tok"
	OperatorToken = "op-token"
	WorkerToken   = "sbw_wtok_x"
	Pool          = "default"
)

// Server is a running server.
type Server struct {
	URL   string
	Store *sqlite.Store
	Plane *sandboxwich.Plane
	// Release is the pool's release: kata, signed with testenv.Key.
	Release lease.Release
	// WorkerID is the worker WorkerToken authenticates: of Tenant, for
	// kata and gVisor cells.
	WorkerID uuid.UUID

	mu   sync.Mutex
	wrap func(real http.Handler, w http.ResponseWriter, r *http.Request)
}

// Start starts a server whose pool Pool of target cells on prov is never
// reconciled unless the test runs a pass (Plane.Pools().Pass); AddPoolCell
// admits cells the way a pass would. The server stops when the test ends.
func Start(t *testing.T, prov driver.Provider, target int) *Server {
	t.Helper()
	return start(t, prov, target, nil)
}

// StartImageClass is Start with the pool an image class (CONTRACT §21)
// of at most target cells, allowing images (pool.Config.Images); prov
// must serve images (driver.Capabilities.Images).
func StartImageClass(t *testing.T, prov driver.Provider, target int, images ...string) *Server {
	t.Helper()
	return start(t, prov, target, images)
}

func start(t *testing.T, prov driver.Provider, target int, images []string) *Server {
	t.Helper()
	keys := testenv.Keyring(t)
	s := &Server{Store: testenv.SQLite(t), Release: testenv.Release(keys, lease.KataMicroVM), WorkerID: uuid.Must(uuid.NewV7())}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var err error
	s.Plane, err = sandboxwich.New(s.Store, keys, sandboxwich.WithLogger(quiet), sandboxwich.WithPools(pool.Config{
		Name: Pool, TenantID: Tenant, Release: s.Release, Target: target, Provider: prov, Images: images}))
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.New(httpapi.Config{
		Plane:  s.Plane,
		Logger: quiet,
		Auth: httpapi.Auth{
			TenantTokens:  map[string]string{TenantToken: Tenant},
			OperatorToken: OperatorToken,
			Workers: map[string]sandboxwich.Worker{WorkerToken: {
				ID: s.WorkerID, TenantID: Tenant, RuntimeClasses: []lease.RuntimeClass{lease.KataMicroVM, lease.GVisorLowerRisk}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.mu.Lock()
		wrap := s.wrap
		s.mu.Unlock()
		if wrap != nil {
			wrap(h, w, r)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// Wrap makes wrap handle requests instead of the real handler, which it
// is given, to simulate faults the real server cannot produce; nil
// restores the real handler.
func (s *Server) Wrap(wrap func(real http.Handler, w http.ResponseWriter, r *http.Request)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wrap = wrap
}

// AddPoolCell admits a ready cell of Pool, as the reconciler would after
// provisioning and verifying it, and returns its ID.
func (s *Server) AddPoolCell(t *testing.T) uuid.UUID {
	t.Helper()
	ctx, now := context.Background(), time.Now()
	id := uuid.Must(uuid.NewV7())
	if _, err := s.Store.CreateMember(ctx, store.CreateMemberParams{CellID: id, Pool: Pool, TenantID: Tenant, Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Store.AdmitMember(ctx, store.AdmitParams{CellID: id, Pool: Pool, WorkerID: "pool:" + Pool,
		ProviderCellID: id.String(), Identity: "test", Release: s.Release, ReadyDeadline: now.Add(10 * time.Minute), Now: now}); err != nil {
		t.Fatal(err)
	}
	return id
}

// CompleteStop proves the provider object of a released pool cell gone,
// as the reconciler would after the provider deleted it.
func (s *Server) CompleteStop(t *testing.T, cellID, leaseID uuid.UUID, d lease.Disposition) {
	t.Helper()
	if _, err := s.Store.CompleteStop(context.Background(), store.StopOutcome{CellID: cellID, StopLeaseID: leaseID,
		StopGeneration: lease.GenerationLeased, Disposition: d, Proven: true, Now: time.Now()}); err != nil {
		t.Error(err)
	}
}
