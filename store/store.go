// Package store defines the persistence contract of Sandboxwich: the Store
// interface that every backend implements, its parameter types, and the
// errors it returns.
//
// Start with [Store]: a few base methods and four roles, each an interface
// of its own — [Leases] (the tenant's claims and leases), [Workers]
// (external workers' cells), [Pools] (the pools' memberships, package
// pool's whole need) and [EventLog]. Each method's doc comment is its
// contract, and each takes a parameter struct (ClaimParams, PrepareParams,
// …) whose fields the caller fills, the current time included. Optional
// abilities are interfaces a Store may also implement, detected by type
// assertion as database/sql/driver detects its optional interfaces:
// [Webhooks], [IdempotencyStore] and [Clock]. store/storetest's
// Example_customStore decorates one role of a real Store and proves it with
// that role's suite.
//
// A Store is where the invariants of sterile cells live. Every method that
// changes state runs one transaction and decides inside it, from the rows it
// reads there, never from a value the caller read earlier: each change is a
// compare-and-set on (state, generation, lease_id). Callers pass the current
// time in every parameter struct, so a Store never reads a clock.
//
// Errors that map to the wire contract are *errcode.Error values
// (errors.Is(err, errcode.ErrNotFound), errcode.ErrConflict, …). Some methods
// commit a change and still return a conflict (a lease found expired is
// quarantined, and the caller is told it is no longer live); their doc
// comments say so.
//
// Two implementations ship: store/sqlite and store/postgres. Both pass the
// conformance suite in store/storetest, which any other implementation should
// run too.
//
// # Stability
//
// The Store interface and its roles grow while the project adds
// capabilities.
// A method is added, never changed in meaning without an entry in the
// changelog (docs/changelog.md), and never removed without a replacement
// named there.
// An outside implementation keeps up the way the shipped ones do: it
// implements the interfaces itself, embedding no other Store or role (an
// embedded one would answer a new method outside the implementation's own
// transactions), and runs storetest.Run (or the suite of each role it
// implements) against every release it upgrades to. A missing method then
// fails to compile, and a wrong one fails the suite. A new optional ability
// is never required: a Store without it keeps working, and its users say
// the ability is missing.
package store

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
)

// Store is the persistence contract: the base methods below and every role
// (Leases, Workers, Pools, EventLog). Implementations must be safe for
// concurrent use by many goroutines and, for shared databases, by many
// processes.
//
// A Store may also implement optional abilities, which their users detect
// by type assertion: [Webhooks] (webhook deliveries), [IdempotencyStore]
// (the HTTP API's Idempotency-Key records) and [Clock] (the database's
// clock). Both shipped stores implement Webhooks and IdempotencyStore;
// store/postgres implements Clock too.
type Store interface {
	// Ping reports whether the database is reachable and migrated.
	Ping(ctx context.Context) error
	// Installation returns the identity of this installation: a random
	// value the database's migrations created once (32 lowercase hex
	// digits in the shipped stores) and that never changes afterwards,
	// whichever process or replica asks. Two databases have different
	// installations. Drivers put a short hash of it on every provider
	// object (driver.InstallationTag), so that planes sharing a provider
	// never take each other's objects for orphans.
	Installation(ctx context.Context) (string, error)
	// Close releases the store's connections.
	Close() error
	// CellCounts returns the number of cells by state.
	CellCounts(ctx context.Context) (map[lease.State]int, error)

	Leases
	Workers
	Pools
	EventLog
}

// Leases is the tenant's side of cells: claims, leases and their fence,
// the listing, revocation and inventory of a tenant's leases, and the
// expiry of cells without a pool. The plane calls it.
type Leases interface {
	// Claim runs one fenced or unfenced claim (CONTRACT §5) in one
	// transaction, retrying internally on contention. A nil Lease in the
	// result means no cell was available (and, when fenced, that this claim
	// ID now durably records empty). Errors: errcode.ErrConflict (digest
	// mismatch, or the recorded lease is no longer live — in that case an
	// expired lease is quarantined first and committed),
	// errcode.ErrClaimContended.
	Claim(ctx context.Context, p ClaimParams) (ClaimResult, error)

	// Lease returns the cell holding leaseID within the tenant, with its
	// pool membership when it has one. Unknown and foreign leases are both
	// errcode.ErrNotFound.
	Lease(ctx context.Context, tenantID string, leaseID uuid.UUID) (LeaseRecord, error)

	// CheckLease applies the lease fence (lease.Cell.CheckProof) to leaseID
	// within the tenant. A fence that matches a lease no longer live
	// quarantines the cell if it is still ready or leased, commits, and
	// returns a conflict wrapping lease.ErrNotLive; a mismatch returns a
	// conflict wrapping lease.ErrFenceMismatch and changes nothing.
	CheckLease(ctx context.Context, p LeaseCheck) (LeaseRecord, error)

	// Release records a tenant's stop intent under the lease fence
	// (CONTRACT §6): membership leased → stopping with the requested
	// disposition. An exact retry while stopping changes nothing. A retry
	// with another disposition is a cleanup fence mismatch: the membership
	// becomes cleanup_pending and the cell quarantined, committed, and a
	// conflict is returned. A cell without membership is
	// errcode.ErrNotFound (after the fence).
	Release(ctx context.Context, p ReleaseParams) (LeaseRecord, error)

	// ListLeases returns a page of the tenant's leases, newest first
	// (CONTRACT §14 listing): the cells that hold one, terminal ones
	// included, with their membership. Leases are ordered by lease ID, a
	// UUIDv7, so by the time they were made; p.Before continues after the
	// last lease of the previous page (keyset pagination: a lease made
	// meanwhile sorts before the page and never shifts the rest). Another
	// tenant's leases are never listed. It changes nothing.
	ListLeases(ctx context.Context, p ListLeasesParams) ([]LeaseRecord, error)

	// Revoke ends a live lease of the tenant without its attestation
	// (CONTRACT §14 revocation). A pool cell's stop is recorded as Release
	// records it: membership leased → stopping with p.Disposition (an exact
	// repeat while stopping changes nothing; another disposition is the
	// cleanup fence mismatch: cleanup_pending, the cell quarantined,
	// committed, and a conflict); the cell stays leased until the provider
	// confirms. A cell prepared by an external worker is quarantined at
	// once. A lease no longer live is a conflict wrapping lease.ErrNotLive
	// (one found expired while still leased is quarantined first,
	// committed); unknown and foreign leases are errcode.ErrNotFound.
	Revoke(ctx context.Context, p RevokeParams) (LeaseRecord, error)

	// Renew moves the expiry of a live lease later (CONTRACT §20), under
	// the lease fence applied as CheckLease applies it (a lease found
	// expired is quarantined, committed, and a conflict wrapping
	// lease.ErrNotLive returned). A pool cell whose stop is already
	// recorded (membership no longer leased) is a conflict and nothing
	// changes. The new expiry is max(current, p.ExpiresAt): a renewal
	// never shortens a lease, and one that moves nothing changes nothing.
	// The caller bounds p.ExpiresAt by the cell's lifetime cap. Nothing
	// but the expiry changes: the expiry the claim granted is kept
	// (Lease.GrantedExpiresAt), so the attestation stays what it was. When
	// the expiry moved, lease.renewed is appended in the same transaction.
	Renew(ctx context.Context, p RenewParams) (LeaseRecord, error)

	// Inventory counts the tenant's claimable cells by release (set,
	// runtime class and policy digest): ready cells whose ready deadline is
	// later than p.After, and the latest of those deadlines; an image
	// class's cells, which only claims naming their image take, are not
	// counted. It changes nothing.
	Inventory(ctx context.Context, p InventoryParams) ([]InventoryEntry, error)

	// CountReady counts the ready cells of a tenant's inventory for exactly
	// a release, whatever their pool's ready floor (never an image class's):
	// all of them, and those whose ready deadline is later than p.After.
	// It changes nothing; the
	// plane runs it only after an empty claim, to say why it was empty.
	CountReady(ctx context.Context, p CountReadyParams) (ReadyCount, error)

	// Evidence returns what was read back from the provider (and agent) of
	// the cell holding leaseID within the tenant, at admission and at its
	// last verification (CONTRACT §15). Unknown and foreign leases are both
	// errcode.ErrNotFound; a cell prepared by an external worker has no
	// membership, hence an Evidence with an empty Pool.
	Evidence(ctx context.Context, tenantID string, leaseID uuid.UUID) (Evidence, error)

	// ExpireUnmanaged quarantines ready and leased cells without membership
	// whose ready deadline or lease expiry is at or before now, and removes
	// expired idempotency records. It returns the number of cells changed.
	ExpireUnmanaged(ctx context.Context, now time.Time) (int, error)
}

// Workers is the side of external workers (CONTRACT §7, §11): the cells a
// worker prepares, and their retirement and destruction. The plane calls
// it.
type Workers interface {
	// Prepare inserts a ready cell for an external worker. A reused cell ID
	// (any earlier cell) or a reused (worker, provider cell ID) is
	// errcode.ErrConflict.
	Prepare(ctx context.Context, p PrepareParams) (lease.Cell, error)

	// WorkerCell returns a cell of the worker with its claim, if any.
	// Another worker's cell is errcode.ErrNotFound.
	WorkerCell(ctx context.Context, workerID string, cellID uuid.UUID) (lease.Cell, *ClaimInfo, error)

	// Retire moves a worker's ready generation-1 cell to quarantined. An
	// exact repeat returns the cell unchanged; anything else is a conflict.
	Retire(ctx context.Context, p RetireParams) (lease.Cell, error)

	// Destroy ends a worker's leased cell with the requested disposition
	// (CONTRACT §7 destroy). A cell not leased, or leased under another lease
	// or generation, is quarantined (committed) and a conflict returned.
	Destroy(ctx context.Context, p DestroyParams) (lease.Cell, error)
}

// Pools is the pools' side of cells: memberships (the pool's record of
// each provider object) from the intent to provision to the proven stop,
// their verification evidence, and the executor locks that let one process
// at a time act on a provider object. The reconciler (package pool) calls
// it, and the plane for the stop of a pool cell.
type Pools interface {
	// CreateMember records a new membership in provisioning: the intent to
	// create a provider object for a cell ID, before the provider is called.
	CreateMember(ctx context.Context, p CreateMemberParams) (Member, error)

	// Replenish records new provisioning members for a pool: in one
	// transaction, serialized with every other Replenish of the pool (on
	// every replica), it counts the live and provisioning members and
	// inserts min(Target − live, MaxProvisioning − provisioning) new ones
	// (never negative), each locked for Owner until LockUntil. It returns
	// the members created, and none with an error: a member returned is
	// committed, and only a committed member may be provisioned.
	Replenish(ctx context.Context, p ReplenishParams) ([]Member, error)

	// AdmitMember, in one transaction, inserts the ready cell of a verified
	// provisioning member and moves the member to ready. A member no longer
	// provisioning is a conflict and nothing is inserted.
	AdmitMember(ctx context.Context, p AdmitParams) (lease.Cell, error)

	// BeginStop records the stop intent of a member (→ stopping) with its
	// fence and requested disposition, if the member is in one of
	// p.From. A ready cell is quarantined in the same transaction, so it can
	// no longer be claimed. It returns the member as recorded; a member in
	// another state is a conflict and nothing changes.
	BeginStop(ctx context.Context, p StopIntent) (Member, error)

	// CompleteStop records the outcome of a provider destroy. With proof of
	// absence under the exact recorded fence, the cell takes its terminal
	// disposition and the member becomes terminal with provider_absent. A
	// fence mismatch, an error or an uncertain result moves the member to
	// cleanup_pending and quarantines the cell.
	CompleteStop(ctx context.Context, p StopOutcome) (Member, error)

	// Members lists the memberships of a pool in the given states (all when
	// none given), oldest first.
	Members(ctx context.Context, pool string, states ...lease.MemberState) ([]Member, error)

	// Member returns one membership by cell ID.
	Member(ctx context.Context, cellID uuid.UUID) (Member, error)

	// MemberCounts returns the number of memberships by state for every pool
	// that has any.
	MemberCounts(ctx context.Context) (map[string]map[lease.MemberState]int, error)

	// RecordVerification records what a periodic verification of a live
	// member read back from its provider (and agent), and when. A member
	// no longer ready or leased is left as it is, without an error.
	RecordVerification(ctx context.Context, p VerificationParams) error

	// LockMember takes or renews the executor lock of a member for owner
	// until the given time, so that one process at a time acts on its
	// provider object. It reports false when another owner holds an
	// unexpired lock.
	LockMember(ctx context.Context, cellID uuid.UUID, owner string, until, now time.Time) (bool, error)

	// UnlockMember releases owner's executor lock, if it still holds it.
	UnlockMember(ctx context.Context, cellID uuid.UUID, owner string) error
}

// EventLog is the event log (CONTRACT §16): every change of state of a
// cell or a pool member appends its events in the transaction that makes
// the change; readers follow it by id.
type EventLog interface {
	// Events returns, oldest first, up to q.Limit events of the log
	// (CONTRACT §16) whose id is above q.After and that match q. Every
	// change of state of a cell or a pool member appends its events in the
	// transaction that makes the change, with ids that increase strictly in
	// the order the transactions commit: a reader that has seen an id has
	// seen (or may still read) every id below it, on every replica. A q.After
	// below what pruning may have removed is errcode.ErrEventsExpired.
	Events(ctx context.Context, q EventQuery) ([]Event, error)

	// LastEventID returns the id of the newest event of the log, 0 when it
	// has none: where a reader that wants only new events starts.
	LastEventID(ctx context.Context) (uint64, error)

	// PruneEvents deletes the events older than before, oldest first,
	// always keeping the newest event of the log (so that an id is never
	// handed out twice), and the webhook deliveries of the events it
	// deletes. It returns how many events it deleted.
	PruneEvents(ctx context.Context, before time.Time) (int, error)
}

// Webhooks is the optional ability of a Store to keep webhook deliveries
// beside its event log: a Store may also implement Webhooks, and package
// webhook needs it. Both shipped stores do.
type Webhooks interface {
	// EnqueueDeliveries follows the log for one webhook endpoint: in one
	// transaction, serialized with every other for the endpoint (on every
	// replica), it reads up to p.Limit events after the endpoint's cursor
	// (p.Start when it has none yet), records a pending delivery, due at
	// p.Now, of each one p selects, and moves the cursor past the events
	// read. It returns the number of deliveries recorded.
	EnqueueDeliveries(ctx context.Context, p DeliveryEnqueue) (int, error)

	// LeaseDeliveries takes up to p.Limit pending deliveries that are due
	// and not leased (or whose lease expired) for p.Owner until p.Until,
	// with their events, so that one deliverer at a time sends each.
	LeaseDeliveries(ctx context.Context, p DeliveryLease) ([]Delivery, error)

	// FinishDelivery records the outcome of one attempt by the owner of
	// the delivery's lease, releasing it. A delivery no longer leased by
	// p.Owner is errcode.ErrConflict, and nothing changes.
	FinishDelivery(ctx context.Context, p DeliveryOutcome) error

	// Deliveries lists deliveries by event id, oldest first. It changes
	// nothing.
	Deliveries(ctx context.Context, q DeliveryQuery) ([]Delivery, error)

	// DeliveryCounts returns the number of deliveries by endpoint and
	// status.
	DeliveryCounts(ctx context.Context) (map[string]map[string]int, error)
}

// IdempotencyStore keeps the Idempotency-Key records of the HTTP API
// (CONTRACT §10.4). A Store may also implement IdempotencyStore, as both
// shipped stores do (a Plane over a Store without one has no
// Idempotency).
type IdempotencyStore interface {
	// BeginIdempotent looks up (tenant, key). When absent or expired it
	// records a new in-flight entry that expires at p.InFlightUntil and
	// returns it with Created set; otherwise it returns the stored record.
	BeginIdempotent(ctx context.Context, p IdempotencyParams) (IdempotencyRecord, error)

	// FinishIdempotent stores the response of an in-flight entry, keeping
	// it until p.ExpiresAt.
	FinishIdempotent(ctx context.Context, p IdempotencyResult) error

	// DropIdempotent removes an in-flight entry whose response must not be
	// stored (successful claims, 429 and 5xx).
	DropIdempotent(ctx context.Context, tenantID, key string) error
}

// ClaimParams is one claim attempt.
type ClaimParams struct {
	TenantID string
	// ClaimID fences the claim; uuid.Nil makes it an unfenced legacy claim.
	ClaimID uuid.UUID
	// Digest is fence.Digest of the request; used only when fenced.
	Digest       string
	Release      lease.Release
	Binding      lease.Binding
	LeaseSeconds uint64 // already clamped into [1, the plane's maximum]
	// LeaseID is the ID the new lease takes if a cell is leased.
	LeaseID uuid.UUID
	Now     time.Time
	// ReadyFloors maps pool name to ready_floor for pools with a floor.
	ReadyFloors map[string]int
	// Image restricts the claim to cells of that image, pinned by digest,
	// of image classes and fixed pools alike (CONTRACT §21); "" takes
	// only cells that are not an image class's (Part I).
	Image string
	// Pools, when not nil, restricts the claim to cells of those pools:
	// the pools whose egress policy covers the claim's (CONTRACT §22).
	Pools []string
	// Egress is the claim's egress policy in canonical form (package
	// egress), which the leased cell's egress becomes; "" when the claim
	// names none, and the cell keeps its pool's.
	Egress string
	// Waiting marks an attempt of a claim that waits for a cell (CONTRACT
	// §21): when it finds no cell it records nothing, since the caller
	// tries again; an outcome already recorded under its fence still
	// decides it (Replayed). The caller's last attempt leaves Waiting
	// false, so that an empty outcome is recorded.
	Waiting bool
	// EmptyReason is recorded with the empty outcome of a fenced claim and
	// answered by its replays (CONTRACT §21); "" records none (a Part I
	// claim's).
	EmptyReason string
	// Sign returns the attestation digest of a new lease. It runs between
	// picking a cell and writing its lease (inside the transaction, when
	// there is one), so it must be pure and fast; it may run more than
	// once for one claim, and a claim that returns a new (not replayed)
	// lease last signed that lease.
	Sign func(lease.Lease) string
}

// ClaimResult is the outcome of a claim. Lease is nil when empty.
type ClaimResult struct {
	Lease *lease.Lease
	// Replayed is true when a fenced retry returned its earlier outcome.
	Replayed bool
	// PoolName is the pool of the leased cell, if any.
	PoolName string
	// EmptyReason is the reason recorded with an empty outcome
	// (ClaimParams.EmptyReason), when one was; "" otherwise.
	EmptyReason string
}

// CountReadyParams selects an inventory for CountReady.
type CountReadyParams struct {
	TenantID string
	Release  lease.Release
	// After is the time a cell must outlive to count as Lasting: a claim's
	// now + lease_seconds.
	After time.Time
}

// ReadyCount is the outcome of CountReady.
type ReadyCount struct {
	// Ready is the number of ready cells of the inventory.
	Ready int
	// Lasting is the number of those whose ready deadline is later than
	// CountReadyParams.After.
	Lasting int
}

// LeaseRecord is a leased (or formerly leased) cell with its membership.
type LeaseRecord struct {
	Cell   lease.Cell
	Member *Member // nil for cells prepared by an external worker
}

// ListLeasesParams selects a page of a tenant's leases for ListLeases.
type ListLeasesParams struct {
	TenantID string
	// Binding filters by binding: each non-empty field must equal the
	// lease's; empty fields match every lease.
	Binding lease.Binding
	// Live, when set, keeps only leases that are (true) or are not (false)
	// live at Now: the cell is leased and the lease has not expired, a
	// pool cell whose stop is recorded but not yet confirmed included.
	Live *bool
	Now  time.Time
	// Before, unless uuid.Nil, keeps only leases that sort after it in
	// the listing's order (IDs below it): the last lease of the previous
	// page.
	Before uuid.UUID
	// Limit is the largest number of leases returned (at least 1).
	Limit int
}

// RevokeParams ends a tenant's live lease without its attestation.
type RevokeParams struct {
	TenantID string
	LeaseID  uuid.UUID
	// Disposition is the stop a pool cell records; a cell of an external
	// worker is always quarantined.
	Disposition lease.Disposition
	Now         time.Time
}

// InventoryParams selects a tenant's inventory.
type InventoryParams struct {
	TenantID string
	// After is the time a ready cell must outlive to count: now plus the
	// shortest lease.
	After time.Time
}

// InventoryEntry is one release of a tenant's inventory.
type InventoryEntry struct {
	ReleaseSetID string
	RuntimeClass lease.RuntimeClass
	PolicyDigest string
	// Ready counts the release's ready cells that outlive
	// InventoryParams.After.
	Ready int
	// LatestDeadline is the latest ready deadline among them: a claim now
	// finds a cell for any lease that ends before it.
	LatestDeadline time.Time
}

// Evidence is what the plane read back from a pool cell's provider (and
// agent) when the member was admitted and when it was last verified. Never
// an attestation or a digest of one.
type Evidence struct {
	CellID uuid.UUID
	// Pool is the member's pool; "" for a cell prepared by an external
	// worker, of which nothing was read back.
	Pool string
	// RuntimeClass is the runtime class the provider demonstrably
	// admitted, as last read back; "" when none was recorded (a member
	// admitted before this was kept).
	RuntimeClass lease.RuntimeClass
	// AgentDigest is the cell agent's build digest ("sha256:<hex>") the
	// provider reported, as last read back; "" when the cell runs none.
	AgentDigest string
	// ImageDigest is the image digest ("sha256:<hex>") the provider
	// reported as admitted, as last read back; "" when the cell runs no
	// pinned image.
	ImageDigest string
	// Egress is the cell's effective egress policy in canonical form
	// (CONTRACT §22): its pool's, or the narrower one its claim named;
	// "none" for a cell prepared by an external worker.
	Egress string
	// AdmittedAt and VerifiedAt are when the member was admitted and last
	// verified; zero when not recorded.
	AdmittedAt time.Time
	VerifiedAt time.Time
}

// VerificationParams records a successful periodic verification.
type VerificationParams struct {
	CellID uuid.UUID
	// RuntimeClass and AgentDigest are what the verification read back
	// (driver.Observation).
	RuntimeClass lease.RuntimeClass
	AgentDigest  string
	ImageDigest  string
	Now          time.Time
}

// LeaseCheck is a lease fence check.
type LeaseCheck struct {
	TenantID string
	LeaseID  uuid.UUID
	Proof    lease.Proof
	Now      time.Time
}

// RenewParams is a renewal of a lease: its fence and the expiry asked for.
type RenewParams struct {
	LeaseCheck
	// ExpiresAt is the expiry asked for, already bounded by the cell's
	// lifetime cap; an earlier one than the lease's changes nothing.
	ExpiresAt time.Time
	// Read, when not nil, is the lease's record as the caller read it to
	// decide the renewal. A store may renew with one compare-and-set of
	// the fence and Read's expiry instead of reading the record again; it
	// answers as it would without Read.
	Read *LeaseRecord
}

// ReleaseParams is a tenant's release of a lease.
type ReleaseParams struct {
	LeaseCheck
	Disposition lease.Disposition
}

// PrepareParams inserts a cell prepared by an external worker.
type PrepareParams struct {
	CellID         uuid.UUID
	TenantID       string
	WorkerID       string
	ProviderCellID string
	Release        lease.Release
	ExpiresAt      time.Time
	Now            time.Time
}

// ClaimInfo is the claim that leased a cell, as a worker sees it.
type ClaimInfo struct {
	ClaimID    uuid.UUID // uuid.Nil for an unfenced claim
	LeaseID    uuid.UUID
	Generation uint64
	ExpiresAt  time.Time
}

// RetireParams retires a worker's ready cell.
type RetireParams struct {
	WorkerID   string
	CellID     uuid.UUID
	Generation uint64
	Now        time.Time
}

// DestroyParams ends a worker's leased cell.
type DestroyParams struct {
	WorkerID    string
	CellID      uuid.UUID
	LeaseID     uuid.UUID
	Generation  uint64
	Disposition lease.Disposition
	Now         time.Time
}

// Member is a pool membership: the pool's record of one provider object.
type Member struct {
	CellID   uuid.UUID // also the provider's cell ID
	Pool     string
	TenantID string
	State    lease.MemberState
	// RequestedDisposition is fixed when the stop is first recorded.
	RequestedDisposition lease.Disposition
	// StopLeaseID and StopGeneration are the fence the stop was recorded
	// under (uuid.Nil when the cell had no lease; 0 when no cell existed).
	StopLeaseID    uuid.UUID
	StopGeneration uint64
	// ProviderAbsent is true only when a stop completed under the exact
	// recorded fence with proof that the provider object is gone.
	ProviderAbsent bool
	// Identity is what the provider reported when the object was verified
	// (e.g. a Pod UID).
	Identity string
	// Image is the image, pinned by digest, the member of an image class
	// is made of (CONTRACT §21); "" for a fixed pool's member, whose image
	// is its pool's.
	Image     string
	LastError string
	Attempts  int
	CreatedAt time.Time
	UpdatedAt time.Time
	// Cell is the member's cell as it is now, nil before admission.
	Cell *lease.Cell
}

// CreateMemberParams records a provisioning intent.
type CreateMemberParams struct {
	CellID   uuid.UUID
	Pool     string
	TenantID string
	// Image is the member's image (Member.Image); "" for a fixed pool.
	Image string
	Now   time.Time
}

// ReplenishParams asks for new provisioning members.
type ReplenishParams struct {
	Pool            string
	TenantID        string
	Target          int
	MaxProvisioning int
	// Images, for an image class (CONTRACT §21), are the images of the
	// members to create, in order, one member each (an image repeated
	// makes several), as many as Target and MaxProvisioning allow. Nil
	// for a fixed pool: its members are as many as they allow.
	Images []string
	// NewID returns the cell ID of each new member (UUIDv7).
	NewID     func() uuid.UUID
	Owner     string
	LockUntil time.Time
	Now       time.Time
}

// AdmitParams admits a verified member's cell to inventory.
type AdmitParams struct {
	CellID         uuid.UUID
	Pool           string
	WorkerID       string // the pool's provider identity
	ProviderCellID string
	Identity       string
	Release        lease.Release
	ReadyDeadline  time.Time
	Now            time.Time
	// AdmittedClass and AgentDigest are what the verification before
	// admission read back from the provider (driver.Observation): the
	// member's evidence, admitted and verified at Now.
	AdmittedClass lease.RuntimeClass
	AgentDigest   string
	ImageDigest   string
	// Image is the image reference, pinned by digest, the cell runs: its
	// member's (an image class's cell, which only claims that name the
	// image take) or its fixed pool's; "" when the pool pins none.
	Image string
	// Egress is the pool's egress policy in canonical form (CONTRACT §22);
	// "" is none.
	Egress string
}

// StopIntent records that a member's provider object is to be destroyed.
type StopIntent struct {
	CellID      uuid.UUID
	From        []lease.MemberState
	Disposition lease.Disposition
	// Quarantine quarantines the cell at once, whatever its state (a
	// runtime found unverified before an exec). Otherwise only a ready cell
	// is quarantined, and a leased one stays leased until the provider
	// confirms the stop.
	Quarantine bool
	Reason     string
	// EventReason is the reason code (CONTRACT §16) of the events the stop
	// appends: one of the Reason constants, or "" for none.
	EventReason string
	Now         time.Time
}

// StopOutcome is the result of a provider destroy attempted under a fence.
type StopOutcome struct {
	CellID         uuid.UUID
	StopLeaseID    uuid.UUID
	StopGeneration uint64
	Disposition    lease.Disposition
	// Proven is true when the provider proved the object absent.
	Proven bool
	// Error describes a failed or uncertain attempt (never a secret).
	Error string
	Now   time.Time
}

// IdempotencyParams begins an idempotent request.
type IdempotencyParams struct {
	TenantID      string
	Key           string
	Fingerprint   string
	Now           time.Time
	InFlightUntil time.Time
}

// IdempotencyRecord is a stored idempotent request.
type IdempotencyRecord struct {
	Fingerprint string
	// Created is true when this call recorded a new in-flight entry.
	Created bool
	// Done is true when a response is stored.
	Done   bool
	Status int
	Body   []byte
}

// IdempotencyResult stores the response of an idempotent request.
type IdempotencyResult struct {
	TenantID  string
	Key       string
	Status    int
	Body      []byte
	ExpiresAt time.Time
}

// Clock is implemented by a store whose database keeps the one clock every
// replica sharing it can read (store/postgres). A plane over such a store
// corrects its own clock by its measured offset from the database's, so
// that replicas whose clocks disagree still agree on every expiry
// (sandboxwich.WithClockSync). A store of one process (store/sqlite)
// needs none: its replicas are one process on one clock.
type Clock interface {
	// DatabaseTime returns the database's current time.
	DatabaseTime(ctx context.Context) (time.Time, error)
}

// Reason codes of events (CONTRACT §16): why a cell, a member or a lease
// changed. Never free text.
const (
	ReasonClaimed           = "claimed"
	ReasonReleased          = "released"
	ReasonRevoked           = "revoked"
	ReasonExpired           = "expired"
	ReasonRenewed           = "renewed"
	ReasonReadyTTL          = "ready_ttl"
	ReasonFenceMismatch     = "fence_mismatch"
	ReasonRuntimeUnverified = "runtime_unverified"
	ReasonImageUnverified   = "image_unverified"
	ReasonAgentUnverified   = "agent_unverified"
	ReasonCellLost          = "cell_lost"
	ReasonDeletionProven    = "deletion_proven"
	ReasonDeletionUncertain = "deletion_uncertain"
	ReasonProvisionFailed   = "provision_failed"
	ReasonWorkerDestroy     = "worker_destroy"
	ReasonWorkerRetire      = "worker_retire"
)

// Event is one entry of the event log (CONTRACT §16): a change of state of
// a cell (Type "cell.<to>") or of a pool member ("member.<to>"), or the end
// of a lease ("lease.released", "lease.revoked", "lease.expired") or its
// renewal ("lease.renewed"). Never an
// attestation, a digest, a token, a provider locator or provider error
// text.
type Event struct {
	// ID increases strictly, per database, in commit order.
	ID       uint64
	Type     string
	At       time.Time
	TenantID string
	// Pool is "" for a cell prepared by an external worker.
	Pool   string
	CellID uuid.UUID
	// LeaseID is uuid.Nil when the cell had no lease.
	LeaseID uuid.UUID
	// MemberID is the member's cell ID for member events, uuid.Nil
	// otherwise.
	MemberID uuid.UUID
	// Generation is the cell's generation after the change (0 when no cell
	// existed yet).
	Generation uint64
	// From and To are the states before and after ("" From for a new cell
	// or member; both "" for lease events).
	From, To string
	// Disposition is a member's requested disposition, once recorded.
	Disposition    lease.Disposition
	ProviderAbsent bool
	// Reason is one of the Reason constants, or "".
	Reason string
}

// EventQuery selects events for Events.
type EventQuery struct {
	// After is the id of the last event the reader has seen (0: none).
	After uint64
	// Oldest, instead of After, starts at the oldest event the log still
	// holds: a reader without a position that wants what is retained.
	Oldest bool
	// Limit is the largest number of events returned (at least 1).
	Limit int
	// TenantID keeps only the tenant's events; "" keeps every tenant's.
	TenantID string
	// Members keeps member events too; without it only cell and lease
	// events are returned.
	Members bool
	// TypePrefix keeps events whose type starts with it ("cell.",
	// "lease.released").
	TypePrefix string
	// Pool keeps events of that pool.
	Pool string
	// LeaseID, unless uuid.Nil, keeps events of that lease.
	LeaseID uuid.UUID
}

// Statuses of a webhook delivery.
const (
	DeliveryPending   = "pending"
	DeliveryDelivered = "delivered"
	DeliveryFailed    = "failed"
)

// DeliveryEnqueue follows the log for one webhook endpoint.
type DeliveryEnqueue struct {
	// Endpoint names the endpoint (a stable key, never its URL).
	Endpoint string
	// TenantID keeps the tenant's events only.
	TenantID string
	// Types keeps events whose type starts with one of them; none keeps
	// every type.
	Types []string
	// Start is the cursor of an endpoint seen for the first time: the id
	// after which its deliveries begin.
	Start uint64
	// Limit bounds the events read (at least 1).
	Limit int
	Now   time.Time
}

// DeliveryLease leases due deliveries to one deliverer.
type DeliveryLease struct {
	Owner string
	Until time.Time
	Now   time.Time
	Limit int
}

// Delivery is one event to deliver to one endpoint.
type Delivery struct {
	Endpoint string
	EventID  uint64
	TenantID string
	Status   string
	// Attempts counts the attempts made.
	Attempts int
	// NextAt is when the next attempt is due (pending deliveries).
	NextAt time.Time
	// LastStatus and LastError describe the last failed attempt (an HTTP
	// status, or 0 and what went wrong; never a secret or a body).
	LastStatus int
	LastError  string
	CreatedAt  time.Time
	UpdatedAt  time.Time
	// Event is the event, as LeaseDeliveries returns it; nil when pruned
	// from the log, and in listings.
	Event *Event
}

// DeliveryOutcome is the result of one attempt.
type DeliveryOutcome struct {
	Endpoint string
	EventID  uint64
	Owner    string
	// Status is DeliveryDelivered, DeliveryFailed (no more attempts), or
	// DeliveryPending: another attempt at Next.
	Status     string
	Next       time.Time
	HTTPStatus int
	Error      string
	Now        time.Time
}

// DeliveryQuery selects deliveries for Deliveries.
type DeliveryQuery struct {
	// TenantID keeps the tenant's deliveries; "" keeps all.
	TenantID string
	// Status keeps deliveries in that status; "" keeps all.
	Status string
	// After keeps deliveries of events after this id.
	After uint64
	// Limit is the largest number returned (at least 1).
	Limit int
}
