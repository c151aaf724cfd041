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

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/store/storetest"
)

// meteredStore is a custom Store: it counts the calls of every method,
// for a metrics endpoint, and leaves the work to another Store (here the
// SQLite one). It implements every method itself and embeds nothing, as
// store.Store's stability policy asks: when the interface gains a method,
// this type stops compiling until it meters that one too, instead of
// passing it through unseen. Whatever a Store does — a backend of its own,
// or a wrapper like this one — storetest.Run proves it (conformance,
// below).
type meteredStore struct {
	inner store.Store
	mu    sync.Mutex
	calls map[string]int
}

func newMeteredStore(inner store.Store) *meteredStore {
	return &meteredStore{inner: inner, calls: map[string]int{}}
}

func (s *meteredStore) count(method string) {
	s.mu.Lock()
	s.calls[method]++
	s.mu.Unlock()
}

// Calls returns the number of calls of each method so far.
func (s *meteredStore) Calls() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.calls)
}

var _ store.Store = (*meteredStore)(nil)

// The store itself.

func (s *meteredStore) Ping(ctx context.Context) error {
	s.count("Ping")
	return s.inner.Ping(ctx)
}

func (s *meteredStore) Close() error {
	s.count("Close")
	return s.inner.Close()
}

func (s *meteredStore) Installation(ctx context.Context) (string, error) {
	s.count("Installation")
	return s.inner.Installation(ctx)
}

// Tenant calls: claims and leases.

func (s *meteredStore) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	s.count("Claim")
	return s.inner.Claim(ctx, p)
}

func (s *meteredStore) Lease(ctx context.Context, tenantID string, leaseID uuid.UUID) (store.LeaseRecord, error) {
	s.count("Lease")
	return s.inner.Lease(ctx, tenantID, leaseID)
}

func (s *meteredStore) CheckLease(ctx context.Context, p store.LeaseCheck) (store.LeaseRecord, error) {
	s.count("CheckLease")
	return s.inner.CheckLease(ctx, p)
}

func (s *meteredStore) Release(ctx context.Context, p store.ReleaseParams) (store.LeaseRecord, error) {
	s.count("Release")
	return s.inner.Release(ctx, p)
}

func (s *meteredStore) ListLeases(ctx context.Context, p store.ListLeasesParams) ([]store.LeaseRecord, error) {
	s.count("ListLeases")
	return s.inner.ListLeases(ctx, p)
}

func (s *meteredStore) Revoke(ctx context.Context, p store.RevokeParams) (store.LeaseRecord, error) {
	s.count("Revoke")
	return s.inner.Revoke(ctx, p)
}

func (s *meteredStore) Inventory(ctx context.Context, p store.InventoryParams) ([]store.InventoryEntry, error) {
	s.count("Inventory")
	return s.inner.Inventory(ctx, p)
}

func (s *meteredStore) Evidence(ctx context.Context, tenantID string, leaseID uuid.UUID) (store.Evidence, error) {
	s.count("Evidence")
	return s.inner.Evidence(ctx, tenantID, leaseID)
}

// External workers' cells.

func (s *meteredStore) Prepare(ctx context.Context, p store.PrepareParams) (lease.Cell, error) {
	s.count("Prepare")
	return s.inner.Prepare(ctx, p)
}

func (s *meteredStore) WorkerCell(ctx context.Context, workerID string, cellID uuid.UUID) (lease.Cell, *store.ClaimInfo, error) {
	s.count("WorkerCell")
	return s.inner.WorkerCell(ctx, workerID, cellID)
}

func (s *meteredStore) Retire(ctx context.Context, p store.RetireParams) (lease.Cell, error) {
	s.count("Retire")
	return s.inner.Retire(ctx, p)
}

func (s *meteredStore) Destroy(ctx context.Context, p store.DestroyParams) (lease.Cell, error) {
	s.count("Destroy")
	return s.inner.Destroy(ctx, p)
}

func (s *meteredStore) ExpireUnmanaged(ctx context.Context, now time.Time) (int, error) {
	s.count("ExpireUnmanaged")
	return s.inner.ExpireUnmanaged(ctx, now)
}

// Pool members.

func (s *meteredStore) RecordVerification(ctx context.Context, p store.VerificationParams) error {
	s.count("RecordVerification")
	return s.inner.RecordVerification(ctx, p)
}

func (s *meteredStore) CreateMember(ctx context.Context, p store.CreateMemberParams) (store.Member, error) {
	s.count("CreateMember")
	return s.inner.CreateMember(ctx, p)
}

func (s *meteredStore) Replenish(ctx context.Context, p store.ReplenishParams) ([]store.Member, error) {
	s.count("Replenish")
	return s.inner.Replenish(ctx, p)
}

func (s *meteredStore) AdmitMember(ctx context.Context, p store.AdmitParams) (lease.Cell, error) {
	s.count("AdmitMember")
	return s.inner.AdmitMember(ctx, p)
}

func (s *meteredStore) BeginStop(ctx context.Context, p store.StopIntent) (store.Member, error) {
	s.count("BeginStop")
	return s.inner.BeginStop(ctx, p)
}

func (s *meteredStore) CompleteStop(ctx context.Context, p store.StopOutcome) (store.Member, error) {
	s.count("CompleteStop")
	return s.inner.CompleteStop(ctx, p)
}

func (s *meteredStore) Members(ctx context.Context, pool string, states ...lease.MemberState) ([]store.Member, error) {
	s.count("Members")
	return s.inner.Members(ctx, pool, states...)
}

func (s *meteredStore) Member(ctx context.Context, cellID uuid.UUID) (store.Member, error) {
	s.count("Member")
	return s.inner.Member(ctx, cellID)
}

func (s *meteredStore) LockMember(ctx context.Context, cellID uuid.UUID, owner string, until, now time.Time) (bool, error) {
	s.count("LockMember")
	return s.inner.LockMember(ctx, cellID, owner, until, now)
}

func (s *meteredStore) UnlockMember(ctx context.Context, cellID uuid.UUID, owner string) error {
	s.count("UnlockMember")
	return s.inner.UnlockMember(ctx, cellID, owner)
}

// Counts.

func (s *meteredStore) MemberCounts(ctx context.Context) (map[string]map[lease.MemberState]int, error) {
	s.count("MemberCounts")
	return s.inner.MemberCounts(ctx)
}

func (s *meteredStore) CellCounts(ctx context.Context) (map[lease.State]int, error) {
	s.count("CellCounts")
	return s.inner.CellCounts(ctx)
}

func (s *meteredStore) CountReady(ctx context.Context, p store.CountReadyParams) (store.ReadyCount, error) {
	s.count("CountReady")
	return s.inner.CountReady(ctx, p)
}

// Idempotency records (store.IdempotencyStore).

func (s *meteredStore) BeginIdempotent(ctx context.Context, p store.IdempotencyParams) (store.IdempotencyRecord, error) {
	s.count("BeginIdempotent")
	return s.inner.BeginIdempotent(ctx, p)
}

func (s *meteredStore) FinishIdempotent(ctx context.Context, p store.IdempotencyResult) error {
	s.count("FinishIdempotent")
	return s.inner.FinishIdempotent(ctx, p)
}

func (s *meteredStore) DropIdempotent(ctx context.Context, tenantID, key string) error {
	s.count("DropIdempotent")
	return s.inner.DropIdempotent(ctx, tenantID, key)
}

// conformance is what the store's own test calls:
//
//	func TestConformance(t *testing.T) { conformance(t) }
//
// Every call of newStore returns a store over a database of its own.
func conformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		inner, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "cells.db"), sqlite.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return newMeteredStore(inner) // Run closes it
	})
}

// TestCustomStoreConformance runs the suite the custom-store example
// shows, so the example is a proven Store.
func TestCustomStoreConformance(t *testing.T) { conformance(t) }

// Example_customStore shows a custom Store and how its test proves it
// with storetest.Run (conformance, above, which this package's
// TestCustomStoreConformance runs).
func Example_customStore() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "custom-store-")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	inner, err := sqlite.Open(ctx, filepath.Join(dir, "cells.db"), sqlite.Options{})
	if err != nil {
		panic(err)
	}
	s := newMeteredStore(inner)
	defer s.Close()
	if err := s.Ping(ctx); err != nil {
		panic(err)
	}
	counts, err := s.CellCounts(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println(counts[lease.Ready], "ready cells;", "calls:", s.Calls())
	// Output: 0 ready cells; calls: map[CellCounts:1 Ping:1]
}

// The event log.

func (s *meteredStore) Events(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	s.count("Events")
	return s.inner.Events(ctx, q)
}

func (s *meteredStore) LastEventID(ctx context.Context) (uint64, error) {
	s.count("LastEventID")
	return s.inner.LastEventID(ctx)
}

func (s *meteredStore) PruneEvents(ctx context.Context, before time.Time) (int, error) {
	s.count("PruneEvents")
	return s.inner.PruneEvents(ctx, before)
}

func (s *meteredStore) EnqueueDeliveries(ctx context.Context, p store.DeliveryEnqueue) (int, error) {
	s.count("EnqueueDeliveries")
	return s.inner.EnqueueDeliveries(ctx, p)
}

func (s *meteredStore) LeaseDeliveries(ctx context.Context, p store.DeliveryLease) ([]store.Delivery, error) {
	s.count("LeaseDeliveries")
	return s.inner.LeaseDeliveries(ctx, p)
}

func (s *meteredStore) FinishDelivery(ctx context.Context, p store.DeliveryOutcome) error {
	s.count("FinishDelivery")
	return s.inner.FinishDelivery(ctx, p)
}

func (s *meteredStore) Deliveries(ctx context.Context, q store.DeliveryQuery) ([]store.Delivery, error) {
	s.count("Deliveries")
	return s.inner.Deliveries(ctx, q)
}

func (s *meteredStore) DeliveryCounts(ctx context.Context) (map[string]map[string]int, error) {
	s.count("DeliveryCounts")
	return s.inner.DeliveryCounts(ctx)
}
