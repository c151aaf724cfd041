package sandboxwich

import (
	"context"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
)

// Renew extends a live lease (CONTRACT §20): after the lease fence, its
// expiry becomes max(current, min(now + leaseSeconds, the cell's lifetime
// cap)), with leaseSeconds clamped as a claim's is. It never shortens a
// lease and changes nothing but its expiry: the attestation stays the
// lease's one credential, so a renewal is safe to retry and requests in
// flight are never refused because of one. The cell's agent is told the
// new expiry first; when it cannot be told, the error is what an exec
// would get from it and nothing changes. A lease not live, or whose stop
// is already recorded (released or revoked), is errcode.ErrConflict (an
// expired one is quarantined). It returns the lease as it now is.
func (p *Plane) Renew(ctx context.Context, tenantID string, leaseID uuid.UUID, pr Proof, leaseSeconds uint64) (lease.Lease, error) {
	chk := p.check(tenantID, leaseID, pr)
	rec, err := p.store.CheckLease(ctx, chk)
	if err != nil {
		return lease.Lease{}, err
	}
	return p.renew(ctx, rec, chk, leaseSeconds)
}

// RenewLease is Renew for the tenant alone, without the lease's
// attestation, as revocation is: for facades whose clients renew with the
// tenant's credential only (the E2B SDK's set_timeout). The tenant's
// authority is the fence.
func (p *Plane) RenewLease(ctx context.Context, tenantID string, leaseID uuid.UUID, leaseSeconds uint64) (lease.Lease, error) {
	rec, err := p.store.Lease(ctx, tenantID, leaseID)
	if err != nil {
		return lease.Lease{}, err
	}
	l := rec.Cell.Lease
	if l == nil {
		return lease.Lease{}, errcode.New(errcode.NotFound, "lease not found")
	}
	chk := store.LeaseCheck{TenantID: tenantID, LeaseID: leaseID, Now: p.Now(),
		Proof: lease.Proof{Generation: rec.Cell.Generation, Binding: l.Binding, AttestationDigest: l.AttestationDigest}}
	// The fence is the lease's own: only its liveness can fail, and then
	// CheckLease answers (quarantining a lease found expired).
	if rec.Cell.CheckProof(chk.Proof, chk.Now) != nil {
		if _, err := p.store.CheckLease(ctx, chk); err != nil {
			return lease.Lease{}, err
		}
	}
	return p.renew(ctx, rec, chk, leaseSeconds)
}

// renew renews the lease of rec, which passed the fence chk.
func (p *Plane) renew(ctx context.Context, rec store.LeaseRecord, chk store.LeaseCheck, leaseSeconds uint64) (lease.Lease, error) {
	l := rec.Cell.Lease
	if m := rec.Member; m != nil && m.State != lease.MemberLeased {
		return lease.Lease{}, errcode.New(errcode.Conflict, "the lease was released; its cell is stopping")
	}
	now := p.Now()
	to := now.Add(time.Duration(p.clampLeaseSeconds(&leaseSeconds)) * time.Second)
	if lifetime := p.lifetimeCap(rec); lifetime.Before(to) {
		to = lifetime
	}
	if !to.After(l.ExpiresAt) {
		return *l, nil // a renewal never shortens a lease
	}
	if err := p.tellAgent(ctx, rec, to, now); err != nil {
		return lease.Lease{}, err
	}
	rec, err := p.store.Renew(ctx, store.RenewParams{LeaseCheck: chk, ExpiresAt: to, Read: &rec})
	if err != nil {
		return lease.Lease{}, err
	}
	p.log.Debug("lease renewed", "tenant", chk.TenantID, "lease_id", l.ID, "expires_at", rec.Cell.Lease.ExpiresAt)
	return *rec.Cell.Lease, nil
}

// lifetimeCap is the latest expiry rec's lease may have (CONTRACT §20): a
// pool cell's claim time plus its pool's MaxCell; an external worker's
// cell, its prepared expiry. A lease made before renewal existed has no
// claim time and keeps its expiry.
func (p *Plane) lifetimeCap(rec store.LeaseRecord) time.Time {
	c, l := rec.Cell, rec.Cell.Lease
	if c.PoolName == "" {
		return c.ExpiresAt
	}
	if l.LeasedAt.IsZero() {
		return l.ExpiresAt
	}
	maxCell := pool.DefaultMaxCell
	if p.pools != nil {
		if cfg, ok := p.pools.Pool(c.PoolName); ok {
			maxCell = cfg.MaxCell
		}
	}
	return l.LeasedAt.Add(maxCell)
}

// tellAgent sends the cell's agent, when its provider has one, the
// activation of the lease with its new expiry to: the agent moves its
// deadline (or takes it as its first activation). It reads nothing back
// from the provider: a renewal runs nothing in the cell, and the next
// operation verifies the runtime as every operation does.
func (p *Plane) tellAgent(ctx context.Context, rec store.LeaseRecord, to, now time.Time) error {
	m, l := rec.Member, rec.Cell.Lease
	if m == nil {
		return nil // an external worker's cell: its worker runs it
	}
	host, ok := p.provider(m.Pool).(driver.AgentHost)
	if !ok {
		return nil
	}
	act := activation(m, l, to, now)
	actx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	conn, err := host.Agent(actx, driver.Object{CellID: m.CellID, Identity: m.Identity})
	if err == nil {
		err = conn.Activate(actx, act)
	}
	if err != nil {
		return p.agentError(ctx, m, err)
	}
	return nil
}
