package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// ListLeases implements store.Store. The query is built from the filters
// given; every variant is served by the index on (tenant_id, lease_id) of
// leased cells (migration 4), scanned backwards from p.Before, the filters
// applied to the rows it meets. Lease IDs are lowercase hyphenated UUIDs of
// one length, so every collation orders them as their bytes.
func (s *Store) ListLeases(ctx context.Context, p store.ListLeasesParams) ([]store.LeaseRecord, error) {
	if p.TenantID == "" || p.Limit < 1 {
		return nil, errcode.New(errcode.InvalidRequest, "list parameters are incomplete")
	}
	var q strings.Builder
	q.WriteString(`SELECT ` + cellCols + `, ` + memberCols + `
		FROM cells c LEFT JOIN pool_members m ON m.cell_id = c.id AND m.pool_name = c.pool_name
		WHERE c.tenant_id = ? AND c.lease_id IS NOT NULL`)
	args := []any{p.TenantID}
	if p.Before != uuid.Nil {
		q.WriteString(` AND c.lease_id < ?`)
		args = append(args, p.Before.String())
	}
	b := p.Binding
	for _, f := range []struct{ col, v string }{
		{"organization_id", b.OrganizationID}, {"workspace_id", b.WorkspaceID},
		{"thread_id", b.ThreadID}, {"runner_session_id", b.RunnerSessionID},
	} {
		if f.v != "" {
			q.WriteString(` AND c.` + f.col + ` = ?`)
			args = append(args, f.v)
		}
	}
	if p.Live != nil {
		// lease.Cell.LeaseLive: leased, and the lease ends after now.
		live := `c.state = 'leased' AND c.lease_expires_us > ?`
		if !*p.Live {
			live = `NOT (` + live + `)`
		}
		q.WriteString(` AND ` + live)
		args = append(args, us(p.Now))
	}
	q.WriteString(` ORDER BY c.lease_id DESC LIMIT ?`)
	args = append(args, p.Limit)
	rows, err := s.r.db.QueryxContext(ctx, s.r.db.Rebind(q.String()), args...)
	if err != nil {
		return nil, s.fail(ctx, "list leases", err)
	}
	defer rows.Close()
	out := []store.LeaseRecord{}
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return nil, s.fail(ctx, "list leases", err)
		}
		out = append(out, rec)
	}
	return out, s.fail(ctx, "list leases", rows.Err())
}

// Revoke implements store.Store.
func (s *Store) Revoke(ctx context.Context, p store.RevokeParams) (store.LeaseRecord, error) {
	if !lease.ValidDisposition(p.Disposition) {
		return store.LeaseRecord{}, errcode.New(errcode.InvalidRequest, "disposition must be destroyed or quarantined")
	}
	var rec store.LeaseRecord
	err := s.inTx(ctx, func(tx txn) error {
		var err error
		if rec, err = s.lockedRecord(ctx, tx, p.TenantID, p.LeaseID); err != nil {
			return err
		}
		if !rec.Cell.LeaseLive(p.Now) {
			if rec.Cell.State.Terminal() {
				return fenceError(lease.ErrNotLive)
			}
			if err := s.quarantine(ctx, tx, &rec.Cell, store.ReasonExpired, p.Now); err != nil {
				return err
			}
			return commitThen{fenceError(lease.ErrNotLive)}
		}
		if rec.Member == nil {
			return s.quarantine(ctx, tx, &rec.Cell, store.ReasonRevoked, p.Now)
		}
		return s.stopLeased(ctx, tx, &rec, p.Disposition, "revoked by tenant", store.ReasonRevoked, p.Now)
	})
	return rec, s.fail(ctx, "revoke", err)
}

// Inventory implements store.Store.
func (s *Store) Inventory(ctx context.Context, p store.InventoryParams) ([]store.InventoryEntry, error) {
	var rows []struct {
		ReleaseSetID string `db:"release_set_id"`
		RuntimeClass string `db:"runtime_class"`
		PolicyDigest string `db:"policy_digest"`
		Ready        int    `db:"ready"`
		LatestUS     int64  `db:"latest_us"`
	}
	if err := s.r.all(ctx, &rows, s.q.inventory, p.TenantID, us(p.After)); err != nil {
		return nil, s.fail(ctx, "inventory", err)
	}
	out := make([]store.InventoryEntry, 0, len(rows))
	for _, r := range rows {
		out = append(out, store.InventoryEntry{ReleaseSetID: r.ReleaseSetID, RuntimeClass: lease.RuntimeClass(r.RuntimeClass),
			PolicyDigest: r.PolicyDigest, Ready: r.Ready, LatestDeadline: fromUS(r.LatestUS)})
	}
	return out, nil
}

// Evidence implements store.Store.
func (s *Store) Evidence(ctx context.Context, tenantID string, leaseID uuid.UUID) (store.Evidence, error) {
	var id, pool, class, digest, image sql.NullString
	var egress string
	var admitted, verified sql.NullInt64
	err := s.r.row(ctx, s.q.evidence, leaseID.String(), tenantID).Scan(&id, &pool, &class, &digest, &image, &egress, &admitted, &verified)
	if errors.Is(err, sql.ErrNoRows) {
		return store.Evidence{}, errLeaseNotFound
	}
	if err != nil {
		return store.Evidence{}, s.fail(ctx, "evidence", err)
	}
	cellID, err := uuid.Parse(id.String)
	if err != nil {
		return store.Evidence{}, s.fail(ctx, "evidence", err)
	}
	ev := store.Evidence{CellID: cellID, Pool: pool.String, RuntimeClass: lease.RuntimeClass(class.String), AgentDigest: digest.String,
		ImageDigest: image.String, Egress: egress}
	if admitted.Valid {
		ev.AdmittedAt = fromUS(admitted.Int64)
	}
	if verified.Valid {
		ev.VerifiedAt = fromUS(verified.Int64)
	}
	return ev, nil
}

// RecordVerification implements store.Store.
func (s *Store) RecordVerification(ctx context.Context, p store.VerificationParams) error {
	if p.CellID == uuid.Nil || (p.RuntimeClass != "" && !p.RuntimeClass.Valid()) {
		return errcode.New(errcode.InvalidRequest, "verification parameters are invalid")
	}
	_, err := s.w.exec(ctx, s.q.memberVerified, nullString(string(p.RuntimeClass)), nullString(p.AgentDigest), nullString(p.ImageDigest),
		us(p.Now), p.CellID.String(), us(p.Now))
	return s.fail(ctx, "record verification", err)
}
