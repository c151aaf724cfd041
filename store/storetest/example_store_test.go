package storetest_test

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/store/storetest"
)

// meteredLeases decorates one role of a Store, its store.Leases: it counts
// the calls of every method, for a metrics endpoint, and leaves the work to
// the store's own Leases (here the SQLite store's). It implements every
// method itself and embeds nothing, as store.Store's stability policy asks:
// when the role gains a method, this type stops compiling until it meters
// that one too, instead of passing it through unseen. Whatever a role does
// — in a backend of its own, or in a wrapper like this one — its suite
// proves it (storetest.RunLeases, conformance below).
type meteredLeases struct {
	inner store.Leases
	mu    sync.Mutex
	calls map[string]int
}

var _ store.Leases = (*meteredLeases)(nil)

func newMeteredLeases(inner store.Leases) *meteredLeases {
	return &meteredLeases{inner: inner, calls: map[string]int{}}
}

func (s *meteredLeases) count(method string) {
	s.mu.Lock()
	s.calls[method]++
	s.mu.Unlock()
}

// Calls returns the number of calls of each method so far.
func (s *meteredLeases) Calls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.calls)
}

func (s *meteredLeases) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	s.count("Claim")
	return s.inner.Claim(ctx, p)
}

func (s *meteredLeases) Lease(ctx context.Context, tenantID string, leaseID uuid.UUID) (store.LeaseRecord, error) {
	s.count("Lease")
	return s.inner.Lease(ctx, tenantID, leaseID)
}

func (s *meteredLeases) CheckLease(ctx context.Context, p store.LeaseCheck) (store.LeaseRecord, error) {
	s.count("CheckLease")
	return s.inner.CheckLease(ctx, p)
}

func (s *meteredLeases) Release(ctx context.Context, p store.ReleaseParams) (store.LeaseRecord, error) {
	s.count("Release")
	return s.inner.Release(ctx, p)
}

func (s *meteredLeases) ListLeases(ctx context.Context, p store.ListLeasesParams) ([]store.LeaseRecord, error) {
	s.count("ListLeases")
	return s.inner.ListLeases(ctx, p)
}

func (s *meteredLeases) Revoke(ctx context.Context, p store.RevokeParams) (store.LeaseRecord, error) {
	s.count("Revoke")
	return s.inner.Revoke(ctx, p)
}

func (s *meteredLeases) Renew(ctx context.Context, p store.RenewParams) (store.LeaseRecord, error) {
	s.count("Renew")
	return s.inner.Renew(ctx, p)
}

func (s *meteredLeases) Inventory(ctx context.Context, p store.InventoryParams) ([]store.InventoryEntry, error) {
	s.count("Inventory")
	return s.inner.Inventory(ctx, p)
}

func (s *meteredLeases) CountReady(ctx context.Context, p store.CountReadyParams) (store.ReadyCount, error) {
	s.count("CountReady")
	return s.inner.CountReady(ctx, p)
}

func (s *meteredLeases) Evidence(ctx context.Context, tenantID string, leaseID uuid.UUID) (store.Evidence, error) {
	s.count("Evidence")
	return s.inner.Evidence(ctx, tenantID, leaseID)
}

func (s *meteredLeases) ExpireUnmanaged(ctx context.Context, now time.Time) (int, error) {
	s.count("ExpireUnmanaged")
	return s.inner.ExpireUnmanaged(ctx, now)
}

// conformance is what the decorator's own test calls:
//
//	func TestConformance(t *testing.T) { conformance(t) }
//
// Every call of newStore returns a store over a database of its own, which
// sets each scenario up, and the Leases under test.
func conformance(t *testing.T) {
	storetest.RunLeases(t, func(t *testing.T) (store.Store, store.Leases) {
		s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "cells.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return s, newMeteredLeases(s) // the suite closes s
	})
}

// TestCustomStoreConformance runs the suite the example shows, so the
// example's decorator is a proven store.Leases.
func TestCustomStoreConformance(t *testing.T) { conformance(t) }

// Example_customStore shows a decorator of one role of a Store and how its
// test proves it with that role's suite, storetest.RunLeases
// (conformance, above, which this package's TestCustomStoreConformance
// runs).
func Example_customStore() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "custom-store-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	s, err := sqlite.Open(ctx, filepath.Join(dir, "cells.db"), sqlite.Options{})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	leases := newMeteredLeases(s)
	inv, err := leases.Inventory(ctx, store.InventoryParams{TenantID: "acme", After: time.Now()})
	if err != nil {
		panic(err)
	}
	fmt.Println(len(inv), "releases in inventory;", "calls:", leases.Calls())
	// Output: 0 releases in inventory; calls: map[Inventory:1]
}
