// The methods of Store: each forwards to the SQL kit the two SQL stores
// share (store/internal/sqlstore); its contract is the doc comment of the
// interface that declares it.

package postgres

import (
	"context"
	"database/sql"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// DB returns the pool every write transaction runs on, with the store's
// connection settings. It is for tooling and benchmarks (a baseline
// transaction on the same settings); never write the store's tables
// through it.
func (s *Store) DB() *sql.DB { return s.s.DB() }

// Ping implements [store.Store].
func (s *Store) Ping(ctx context.Context) error {
	return s.s.Ping(ctx)
}

// Installation implements [store.Store].
func (s *Store) Installation(ctx context.Context) (string, error) {
	return s.s.Installation(ctx)
}

// Close implements [store.Store].
func (s *Store) Close() error {
	return s.s.Close()
}

// CellCounts implements [store.Store].
func (s *Store) CellCounts(ctx context.Context) (map[lease.State]int, error) {
	return s.s.CellCounts(ctx)
}

// Claim implements [store.Leases].
func (s *Store) Claim(ctx context.Context, p store.ClaimParams) (store.ClaimResult, error) {
	return s.s.Claim(ctx, p)
}

// Lease implements [store.Leases].
func (s *Store) Lease(ctx context.Context, tenantID string, leaseID uuid.UUID) (store.LeaseRecord, error) {
	return s.s.Lease(ctx, tenantID, leaseID)
}

// CheckLease implements [store.Leases].
func (s *Store) CheckLease(ctx context.Context, p store.LeaseCheck) (store.LeaseRecord, error) {
	return s.s.CheckLease(ctx, p)
}

// Release implements [store.Leases].
func (s *Store) Release(ctx context.Context, p store.ReleaseParams) (store.LeaseRecord, error) {
	return s.s.Release(ctx, p)
}

// ListLeases implements [store.Leases].
func (s *Store) ListLeases(ctx context.Context, p store.ListLeasesParams) ([]store.LeaseRecord, error) {
	return s.s.ListLeases(ctx, p)
}

// Revoke implements [store.Leases].
func (s *Store) Revoke(ctx context.Context, p store.RevokeParams) (store.LeaseRecord, error) {
	return s.s.Revoke(ctx, p)
}

// Renew implements [store.Leases].
func (s *Store) Renew(ctx context.Context, p store.RenewParams) (store.LeaseRecord, error) {
	return s.s.Renew(ctx, p)
}

// Inventory implements [store.Leases].
func (s *Store) Inventory(ctx context.Context, p store.InventoryParams) ([]store.InventoryEntry, error) {
	return s.s.Inventory(ctx, p)
}

// CountReady implements [store.Leases].
func (s *Store) CountReady(ctx context.Context, p store.CountReadyParams) (store.ReadyCount, error) {
	return s.s.CountReady(ctx, p)
}

// Evidence implements [store.Leases].
func (s *Store) Evidence(ctx context.Context, tenantID string, leaseID uuid.UUID) (store.Evidence, error) {
	return s.s.Evidence(ctx, tenantID, leaseID)
}

// ExpireUnmanaged implements [store.Leases].
func (s *Store) ExpireUnmanaged(ctx context.Context, now time.Time) (int, error) {
	return s.s.ExpireUnmanaged(ctx, now)
}

// Prepare implements [store.Workers].
func (s *Store) Prepare(ctx context.Context, p store.PrepareParams) (lease.Cell, error) {
	return s.s.Prepare(ctx, p)
}

// WorkerCell implements [store.Workers].
func (s *Store) WorkerCell(ctx context.Context, workerID string, cellID uuid.UUID) (lease.Cell, *store.ClaimInfo, error) {
	return s.s.WorkerCell(ctx, workerID, cellID)
}

// Retire implements [store.Workers].
func (s *Store) Retire(ctx context.Context, p store.RetireParams) (lease.Cell, error) {
	return s.s.Retire(ctx, p)
}

// Destroy implements [store.Workers].
func (s *Store) Destroy(ctx context.Context, p store.DestroyParams) (lease.Cell, error) {
	return s.s.Destroy(ctx, p)
}

// CreateMember implements [store.Pools].
func (s *Store) CreateMember(ctx context.Context, p store.CreateMemberParams) (store.Member, error) {
	return s.s.CreateMember(ctx, p)
}

// Replenish implements [store.Pools].
func (s *Store) Replenish(ctx context.Context, p store.ReplenishParams) ([]store.Member, error) {
	return s.s.Replenish(ctx, p)
}

// AdmitMember implements [store.Pools].
func (s *Store) AdmitMember(ctx context.Context, p store.AdmitParams) (lease.Cell, error) {
	return s.s.AdmitMember(ctx, p)
}

// BeginStop implements [store.Pools].
func (s *Store) BeginStop(ctx context.Context, p store.StopIntent) (store.Member, error) {
	return s.s.BeginStop(ctx, p)
}

// CompleteStop implements [store.Pools].
func (s *Store) CompleteStop(ctx context.Context, p store.StopOutcome) (store.Member, error) {
	return s.s.CompleteStop(ctx, p)
}

// Members implements [store.Pools].
func (s *Store) Members(ctx context.Context, pool string, states ...lease.MemberState) ([]store.Member, error) {
	return s.s.Members(ctx, pool, states...)
}

// Member implements [store.Pools].
func (s *Store) Member(ctx context.Context, cellID uuid.UUID) (store.Member, error) {
	return s.s.Member(ctx, cellID)
}

// MemberCounts implements [store.Pools].
func (s *Store) MemberCounts(ctx context.Context) (map[string]map[lease.MemberState]int, error) {
	return s.s.MemberCounts(ctx)
}

// RecordVerification implements [store.Pools].
func (s *Store) RecordVerification(ctx context.Context, p store.VerificationParams) error {
	return s.s.RecordVerification(ctx, p)
}

// LockMember implements [store.Pools].
func (s *Store) LockMember(ctx context.Context, cellID uuid.UUID, owner string, until, now time.Time) (bool, error) {
	return s.s.LockMember(ctx, cellID, owner, until, now)
}

// UnlockMember implements [store.Pools].
func (s *Store) UnlockMember(ctx context.Context, cellID uuid.UUID, owner string) error {
	return s.s.UnlockMember(ctx, cellID, owner)
}

// Events implements [store.EventLog].
func (s *Store) Events(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	return s.s.Events(ctx, q)
}

// LastEventID implements [store.EventLog].
func (s *Store) LastEventID(ctx context.Context) (uint64, error) {
	return s.s.LastEventID(ctx)
}

// PruneEvents implements [store.EventLog].
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int, error) {
	return s.s.PruneEvents(ctx, before)
}

// EnqueueDeliveries implements [store.Webhooks].
func (s *Store) EnqueueDeliveries(ctx context.Context, p store.DeliveryEnqueue) (int, error) {
	return s.s.EnqueueDeliveries(ctx, p)
}

// LeaseDeliveries implements [store.Webhooks].
func (s *Store) LeaseDeliveries(ctx context.Context, p store.DeliveryLease) ([]store.Delivery, error) {
	return s.s.LeaseDeliveries(ctx, p)
}

// FinishDelivery implements [store.Webhooks].
func (s *Store) FinishDelivery(ctx context.Context, p store.DeliveryOutcome) error {
	return s.s.FinishDelivery(ctx, p)
}

// Deliveries implements [store.Webhooks].
func (s *Store) Deliveries(ctx context.Context, q store.DeliveryQuery) ([]store.Delivery, error) {
	return s.s.Deliveries(ctx, q)
}

// DeliveryCounts implements [store.Webhooks].
func (s *Store) DeliveryCounts(ctx context.Context) (map[string]map[string]int, error) {
	return s.s.DeliveryCounts(ctx)
}

// BeginIdempotent implements [store.IdempotencyStore].
func (s *Store) BeginIdempotent(ctx context.Context, p store.IdempotencyParams) (store.IdempotencyRecord, error) {
	return s.s.BeginIdempotent(ctx, p)
}

// FinishIdempotent implements [store.IdempotencyStore].
func (s *Store) FinishIdempotent(ctx context.Context, p store.IdempotencyResult) error {
	return s.s.FinishIdempotent(ctx, p)
}

// DropIdempotent implements [store.IdempotencyStore].
func (s *Store) DropIdempotent(ctx context.Context, tenantID, key string) error {
	return s.s.DropIdempotent(ctx, tenantID, key)
}
