package sqlstore

import (
	"database/sql"
	"fmt"
	"strconv"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// cellCols and memberCols are the column lists scanCell and scanMember read,
// in order. Member columns come from a LEFT JOIN, so all may be NULL.
const (
	cellCols = `c.id, c.tenant_id, c.worker_id, c.pool_name, c.provider_cell_id, c.state, c.generation,
	c.release_set_id, c.runtime_class, c.policy_digest, c.release_signature, c.ready_deadline_us, c.created_us,
	c.lease_id, c.organization_id, c.workspace_id, c.thread_id, c.runner_session_id, c.lease_expires_us,
	c.attestation_digest, c.lease_granted_us, c.leased_us`
	memberCols = `m.cell_id, m.pool_name, m.tenant_id, m.state, m.requested_disposition, m.stop_lease_id,
	m.stop_generation, m.provider_absent, m.identity, m.last_error, m.attempts, m.created_us, m.updated_us, m.image`
)

// memberCellJoin joins a member to its own cell only: a cell of the same ID
// outside the pool is never the member's.
const memberCellJoin = `LEFT JOIN cells c ON c.id = m.cell_id AND c.pool_name = m.pool_name`

type scanner interface{ Scan(dest ...any) error }

// cellRow is one row of cellCols as scanned. Every field is nullable, so
// the same row scans the right side of a LEFT JOIN; present reports whether
// a cell was there.
type cellRow struct {
	id, tenant, worker, pool, providerCellID, state sql.NullString
	setID, class, digest, sig                       sql.NullString
	generation, deadline, created                   sql.NullInt64
	leaseID, org, ws, thread, sess, attestation     sql.NullString
	expires, granted, leasedAt                      sql.NullInt64
}

func (r *cellRow) dest() []any {
	return []any{&r.id, &r.tenant, &r.worker, &r.pool, &r.providerCellID, &r.state, &r.generation,
		&r.setID, &r.class, &r.digest, &r.sig, &r.deadline, &r.created,
		&r.leaseID, &r.org, &r.ws, &r.thread, &r.sess, &r.expires, &r.attestation, &r.granted, &r.leasedAt}
}

func (r *cellRow) present() bool { return r.id.Valid }

func (r *cellRow) cell() (lease.Cell, error) {
	id, err := uuid.Parse(r.id.String)
	if err != nil {
		return lease.Cell{}, fmt.Errorf("cell id %q: %w", r.id.String, err)
	}
	c := lease.Cell{
		ID:             id,
		TenantID:       r.tenant.String,
		WorkerID:       r.worker.String,
		PoolName:       r.pool.String,
		ProviderCellID: r.providerCellID.String,
		State:          lease.State(r.state.String),
		Generation:     uint64(r.generation.Int64),
		Release: lease.Release{
			ReleaseSetID: r.setID.String,
			RuntimeClass: lease.RuntimeClass(r.class.String),
			PolicyDigest: r.digest.String,
			Signature:    r.sig.String,
		},
		ExpiresAt: fromUS(r.deadline.Int64),
		CreatedAt: fromUS(r.created.Int64),
	}
	if r.leaseID.Valid {
		lid, err := uuid.Parse(r.leaseID.String)
		if err != nil {
			return lease.Cell{}, fmt.Errorf("lease id %q: %w", r.leaseID.String, err)
		}
		c.Lease = &lease.Lease{
			ID:         lid,
			CellID:     id,
			Generation: c.Generation,
			Release:    c.Release,
			Binding: lease.Binding{
				OrganizationID:  r.org.String,
				WorkspaceID:     r.ws.String,
				ThreadID:        r.thread.String,
				RunnerSessionID: r.sess.String,
			},
			ExpiresAt:         fromUS(r.expires.Int64),
			GrantedExpiresAt:  fromUS(r.expires.Int64),
			AttestationDigest: r.attestation.String,
		}
		if r.granted.Valid { // renewed: the expiry the claim granted, kept
			c.Lease.GrantedExpiresAt = fromUS(r.granted.Int64)
		}
		if r.leasedAt.Valid {
			c.Lease.LeasedAt = fromUS(r.leasedAt.Int64)
		}
	}
	return c, nil
}

// memberRow is one row of memberCols as scanned.
type memberRow struct {
	cellID, pool, tenant, state sql.NullString
	disposition, stopLease      sql.NullString
	stopGeneration              sql.NullInt64
	absent                      sql.NullBool
	identity, lastError         sql.NullString
	attempts                    sql.NullInt64
	created, updated            sql.NullInt64
	image                       sql.NullString
}

func (r *memberRow) dest() []any {
	return []any{&r.cellID, &r.pool, &r.tenant, &r.state, &r.disposition, &r.stopLease,
		&r.stopGeneration, &r.absent, &r.identity, &r.lastError, &r.attempts, &r.created, &r.updated, &r.image}
}

// member returns nil when the joined row had no membership.
func (r *memberRow) member() (*store.Member, error) {
	if !r.cellID.Valid {
		return nil, nil
	}
	id, err := uuid.Parse(r.cellID.String)
	if err != nil {
		return nil, fmt.Errorf("member id %q: %w", r.cellID.String, err)
	}
	m := &store.Member{
		CellID:               id,
		Pool:                 r.pool.String,
		TenantID:             r.tenant.String,
		State:                lease.MemberState(r.state.String),
		RequestedDisposition: lease.Disposition(r.disposition.String),
		StopGeneration:       uint64(r.stopGeneration.Int64),
		ProviderAbsent:       r.absent.Bool,
		Identity:             r.identity.String,
		Image:                r.image.String,
		LastError:            r.lastError.String,
		Attempts:             int(r.attempts.Int64),
		CreatedAt:            fromUS(r.created.Int64),
		UpdatedAt:            fromUS(r.updated.Int64),
	}
	if r.stopLease.Valid {
		if m.StopLeaseID, err = uuid.Parse(r.stopLease.String); err != nil {
			return nil, fmt.Errorf("stop lease id %q: %w", r.stopLease.String, err)
		}
	}
	return m, nil
}

// scanRecord scans cellCols followed by memberCols.
func scanRecord(sc scanner) (store.LeaseRecord, error) {
	var c cellRow
	var m memberRow
	if err := sc.Scan(append(c.dest(), m.dest()...)...); err != nil {
		return store.LeaseRecord{}, err
	}
	cell, err := c.cell()
	if err != nil {
		return store.LeaseRecord{}, err
	}
	mem, err := m.member()
	if mem != nil {
		mem.Cell = &cell
	}
	return store.LeaseRecord{Cell: cell, Member: mem}, err
}

func scanCell(sc scanner) (lease.Cell, error) {
	var c cellRow
	if err := sc.Scan(c.dest()...); err != nil {
		return lease.Cell{}, err
	}
	return c.cell()
}

// scanMember scans memberCols followed by cellCols (a LEFT JOIN).
func scanMember(sc scanner) (store.Member, error) {
	var m memberRow
	var c cellRow
	if err := sc.Scan(append(m.dest(), c.dest()...)...); err != nil {
		return store.Member{}, err
	}
	mem, err := m.member()
	if err != nil || mem == nil {
		return store.Member{}, fmt.Errorf("member row: %v", err)
	}
	if c.present() {
		cell, err := c.cell()
		if err != nil {
			return store.Member{}, err
		}
		mem.Cell = &cell
	}
	return *mem, nil
}

// nullUUID stores uuid.Nil as NULL.
func nullUUID(id uuid.UUID) sql.NullString {
	if id == uuid.Nil {
		return sql.NullString{}
	}
	return sql.NullString{String: id.String(), Valid: true}
}

func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }

// queries holds every statement, rebound to the dialect's placeholders.
type queries struct {
	schemaVersion, installation string

	fence, candidate, candidateOrder, readyMembers, leaseCell, fenceInsert, fenceEmpty, memberLeased string
	recordByLease, cellByWorker, claimOfCell                                                         string
	quarantine, renew, toTerminal, prepare                                                           string
	expireReady, expireLeased, expireIdempotency                                                     string

	memberInsert, memberLive, memberAdmit, cellInsertPool, memberStop, memberByID string
	memberCleanup, memberDone, memberLock, memberUnlock                           string
	memberCounts, cellCounts                                                      string
	readyCount                                                                    string
	inventory, evidence, memberVerified                                           string

	idemUpsert, idemGet, idemFinish, idemDrop string

	eventsPruned, lastEvent, firstKept, pruneEvents, pruneMark, pruneDeliveries string

	cursorInit, cursorGet, cursorSet, eventsAfter, eventByID           string
	deliveryInsert, deliveryDue, deliveryLock, deliveryFinish, dCounts string

	// candidateSkip and candidateWait are candidate + candidateOrder + the
	// dialect's row lock, skipping or waiting for rows other transactions
	// locked (skipLocked, waitLocked: the clauses alone).
	candidateSkip, candidateWait, skipLocked, waitLocked string
	// candidatePeek is candidate + candidateOrder without a lock.
	candidatePeek string
	// candidateQueue is candidate in order, the first hintDepth rows: on a
	// dialect whose writers are serialized, one pick serves that many
	// claims (see claimOnce).
	candidateQueue string
	// candidateRaw is candidate before rebinding, for the rare path that
	// excludes pools held at their ready floor.
	candidateRaw string
	// leaseAll and leaseAllFenced are leaseCell, memberLeased and (fenced)
	// fenceInsert as one statement of writable CTEs, for dialects that have
	// them. They return how many cells and members they leased, and the
	// next candidate (or NULLs).
	leaseAll, leaseAllFenced string
	rebind                   func(string) string
}

// oldestFirst is the order claims take an inventory's cells in.
const oldestFirst = ` ORDER BY c.created_us, c.id`

func bindQueries(db *sqlx.DB, d Dialect) queries {
	q := queries{
		rebind:        db.Rebind,
		schemaVersion: `SELECT max(version_id) FROM goose_db_version WHERE is_applied`,
		installation:  `SELECT id FROM installation WHERE singleton = 1`,

		fence: `SELECT f.request_digest, f.empty_reason, ` + cellCols + `
			FROM claim_fences f LEFT JOIN cells c ON c.tenant_id = f.tenant_id AND c.lease_id = f.lease_id
			WHERE f.tenant_id = ? AND f.claim_id = ?`,
		// The CASTs keep SQLite from re-preparing the statement whenever
		// its parameters are rebound, which it does (once sqlite_stat4
		// holds samples, after ANALYZE or PRAGMA optimize) for a bare
		// parameter compared with an indexed column: a parse per claim.
		candidate: `SELECT c.id, c.pool_name, c.ready_deadline_us FROM cells c
			WHERE c.tenant_id = CAST(? AS TEXT) AND c.runtime_class = CAST(? AS TEXT) AND c.release_set_id = CAST(? AS TEXT)
			  AND c.policy_digest = CAST(? AS TEXT) AND c.release_signature = CAST(? AS TEXT) AND c.state = 'ready'
			  AND c.ready_deadline_us > CAST(? AS BIGINT)
			  AND ((CAST(? AS TEXT) = '' AND c.image_class = 0) OR c.image = CAST(? AS TEXT))
			  AND (CAST(? AS TEXT) = '' OR length(replace(CAST(? AS TEXT), ',' || c.pool_name || ',', '')) < length(CAST(? AS TEXT)))`,
		candidateOrder: oldestFirst + ` LIMIT 1`,
		readyMembers:   `SELECT count(*) FROM pool_members WHERE pool_name = CAST(? AS TEXT) AND state = 'ready'`,
		leaseCell: `UPDATE cells SET state = 'leased', generation = 2, lease_id = ?, organization_id = ?,
			workspace_id = ?, thread_id = ?, runner_session_id = ?, lease_expires_us = ?, attestation_digest = ?,
			claim_id = ?, updated_us = ?, leased_us = ?, event_reason = 'claimed', egress = coalesce(NULLIF(CAST(? AS TEXT), ''), egress)
			WHERE id = ? AND ready_deadline_us > CAST(? AS BIGINT) AND state = 'ready' AND generation = 1
			  AND lease_id IS NULL`,
		fenceInsert: `INSERT INTO claim_fences (tenant_id, claim_id, request_digest, lease_id, created_us)
			VALUES (?, ?, ?, ?, ?)`,
		fenceEmpty: `INSERT INTO claim_fences (tenant_id, claim_id, request_digest, lease_id, created_us, empty_reason)
			VALUES (?, ?, ?, NULL, ?, ?)`,
		memberLeased: `UPDATE pool_members SET state = 'leased', updated_us = ?, event_reason = 'claimed' WHERE cell_id = ? AND state = 'ready'`,

		recordByLease: `SELECT ` + cellCols + `, ` + memberCols + `
			FROM cells c LEFT JOIN pool_members m ON m.cell_id = c.id AND m.pool_name = c.pool_name
			WHERE c.lease_id = ? AND c.tenant_id = ?`,
		cellByWorker: `SELECT ` + cellCols + ` FROM cells c WHERE c.id = ? AND c.worker_id = ?`,
		claimOfCell:  `SELECT claim_id FROM cells WHERE id = ? AND claim_id IS NOT NULL`,

		// quarantine and toTerminal are the compare-and-sets of every later
		// transition: the row must still be in the state, generation and
		// lease the caller decided from. Every terminal transition sets
		// retired_us too (to its updated_us).
		quarantine: `UPDATE cells SET state = 'quarantined', updated_us = ?, retired_us = ?, event_reason = ?
			WHERE id = ? AND state = ? AND generation = ? AND state IN ('ready', 'leased')`,
		// renew moves a live lease's expiry later (CONTRACT §20), keeping
		// the expiry the claim granted. Its guard is the whole lease fence
		// (tenant, generation, binding, attestation digest, live at now),
		// the expiry the caller read, and a membership, if any, still
		// leased: it needs no read before it.
		renew: `UPDATE cells SET lease_expires_us = ?, lease_granted_us = coalesce(lease_granted_us, lease_expires_us),
			updated_us = ?
			WHERE lease_id = ? AND tenant_id = ? AND state = 'leased' AND generation = ?
			AND organization_id = ? AND workspace_id = ? AND thread_id = ? AND runner_session_id = ?
			AND attestation_digest = ? AND lease_expires_us = ? AND lease_expires_us > ?
			AND NOT EXISTS (SELECT 1 FROM pool_members m
				WHERE m.cell_id = cells.id AND m.pool_name = cells.pool_name AND m.state <> 'leased')`,
		toTerminal: `UPDATE cells SET state = ?, updated_us = ?, retired_us = ?, event_reason = ?
			WHERE id = ? AND state = 'leased' AND generation = 2 AND lease_id = ?`,
		// A cell ID reserved by a pool member can never be prepared.
		prepare: `INSERT INTO cells (id, tenant_id, worker_id, pool_name, provider_cell_id, state, generation,
			release_set_id, runtime_class, policy_digest, release_signature, ready_deadline_us, created_us, updated_us)
			SELECT ?, ?, ?, NULL, ?, 'ready', 1, ?, ?, ?, ?, ?, ?, ?
			WHERE NOT EXISTS (SELECT 1 FROM pool_members WHERE cell_id = ?)
			ON CONFLICT DO NOTHING`,
		// expireLeased runs first: a leased cell past its ready deadline is
		// past its lease too, so expireReady then scans only ready cells.
		expireLeased: `UPDATE cells SET state = 'quarantined', updated_us = ?, retired_us = ?, event_reason = 'expired'
			WHERE pool_name IS NULL AND state = 'leased' AND lease_expires_us <= ?`,
		expireReady: `UPDATE cells SET state = 'quarantined', updated_us = ?, retired_us = ?, event_reason = 'ready_ttl'
			WHERE pool_name IS NULL AND retired_us IS NULL AND state = 'ready' AND ready_deadline_us <= ?`,
		expireIdempotency: `DELETE FROM idempotency_records WHERE expires_us <= ?`,

		// A cell ID already used by any cell can never become a member.
		memberInsert: `INSERT INTO pool_members (cell_id, pool_name, tenant_id, state, lock_owner, lock_until_us,
			created_us, updated_us, image) SELECT ?, ?, ?, 'provisioning', ?, ?, ?, ?, ?
			WHERE NOT EXISTS (SELECT 1 FROM cells WHERE id = ?)`,
		memberLive: `SELECT count(*), count(CASE WHEN state = 'provisioning' THEN 1 END) FROM pool_members
			WHERE pool_name = ? AND state IN ('provisioning', 'ready', 'leased', 'stopping', 'cleanup_pending')`,
		// memberAdmit ends the provisioner's executor lock with the
		// admission (as memberDone ends a destroyer's), so the unlock
		// that follows changes nothing and costs no commit.
		memberAdmit: `UPDATE pool_members SET state = 'ready', identity = ?, admitted_class = ?, agent_digest = ?, image_digest = ?,
			admitted_us = ?, verified_us = ?, updated_us = ?, event_reason = NULL, lock_owner = NULL, lock_until_us = NULL
			WHERE cell_id = ? AND pool_name = ? AND state = 'provisioning'`,
		cellInsertPool: `INSERT INTO cells (id, tenant_id, worker_id, pool_name, provider_cell_id, state, generation,
			release_set_id, runtime_class, policy_digest, release_signature, ready_deadline_us, created_us, updated_us,
			image, image_class, egress)
			VALUES (?, ?, ?, ?, ?, 'ready', 1, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		memberStop: `UPDATE pool_members SET state = 'stopping', requested_disposition = ?, stop_lease_id = ?,
			stop_generation = ?, last_error = ?, updated_us = ?, event_reason = ?
			WHERE cell_id = ? AND state = ?`,
		memberByID: `SELECT ` + memberCols + `, ` + cellCols + ` FROM pool_members m ` + memberCellJoin + ` WHERE m.cell_id = ?`,
		memberCleanup: `UPDATE pool_members SET state = 'cleanup_pending', attempts = attempts + 1, last_error = ?,
			updated_us = ?, event_reason = ? WHERE cell_id = ? AND state IN ('stopping', 'cleanup_pending')`,
		memberDone: `UPDATE pool_members SET state = ?, provider_absent = TRUE, attempts = attempts + 1,
			last_error = '', lock_owner = NULL, lock_until_us = NULL, updated_us = ?, event_reason = 'deletion_proven'
			WHERE cell_id = ? AND state IN ('stopping', 'cleanup_pending')`,
		memberLock: `UPDATE pool_members SET lock_owner = ?, lock_until_us = ?
			WHERE cell_id = ? AND (lock_owner IS NULL OR lock_owner = ? OR lock_until_us <= ?)`,
		memberUnlock: `UPDATE pool_members SET lock_owner = NULL, lock_until_us = NULL
			WHERE cell_id = ? AND lock_owner = ?`,
		memberCounts: `SELECT pool_name, state, count(*) AS n FROM pool_members GROUP BY pool_name, state`,
		cellCounts:   `SELECT state, count(*) AS n FROM cells GROUP BY state`,
		// readyCount is candidate without its deadline, counting instead.
		readyCount: `SELECT count(*), count(CASE WHEN c.ready_deadline_us > CAST(? AS BIGINT) THEN 1 END) FROM cells c
			WHERE c.tenant_id = CAST(? AS TEXT) AND c.runtime_class = CAST(? AS TEXT) AND c.release_set_id = CAST(? AS TEXT)
			  AND c.policy_digest = CAST(? AS TEXT) AND c.release_signature = CAST(? AS TEXT) AND c.state = 'ready'
			  AND c.image_class = 0`,
		// inventory groups what a claim matches on, but the signature: one
		// release, whoever signed it. Both count what a claim without an
		// image can take: never an image class's cells.
		inventory: `SELECT c.release_set_id AS release_set_id, c.runtime_class AS runtime_class, c.policy_digest AS policy_digest,
				count(*) AS ready, max(c.ready_deadline_us) AS latest_us
			FROM cells c WHERE c.tenant_id = CAST(? AS TEXT) AND c.state = 'ready' AND c.ready_deadline_us > CAST(? AS BIGINT)
			  AND c.image_class = 0
			GROUP BY c.release_set_id, c.runtime_class, c.policy_digest
			ORDER BY c.release_set_id, c.runtime_class, c.policy_digest`,
		evidence: `SELECT c.id, m.pool_name, m.admitted_class, m.agent_digest, m.image_digest, c.egress, m.admitted_us, m.verified_us
			FROM cells c LEFT JOIN pool_members m ON m.cell_id = c.id AND m.pool_name = c.pool_name
			WHERE c.lease_id = ? AND c.tenant_id = ?`,
		// A verification records what it read back; a later one of another
		// replica, whose clock may lag, never moves verified_us back.
		memberVerified: `UPDATE pool_members SET admitted_class = ?, agent_digest = ?, image_digest = ?, verified_us = ?
			WHERE cell_id = ? AND state IN ('ready', 'leased') AND (verified_us IS NULL OR verified_us <= ?)`,

		idemUpsert: `INSERT INTO idempotency_records (tenant_id, idem_key, fingerprint, done, status, body, created_us, expires_us)
			VALUES (?, ?, ?, FALSE, 0, '', ?, ?)
			ON CONFLICT (tenant_id, idem_key) DO UPDATE SET fingerprint = excluded.fingerprint, done = FALSE,
				status = 0, body = '', created_us = excluded.created_us, expires_us = excluded.expires_us
			WHERE idempotency_records.expires_us <= ?`,
		idemGet: `SELECT fingerprint, done, status, body FROM idempotency_records WHERE tenant_id = ? AND idem_key = ?`,
		idemFinish: `UPDATE idempotency_records SET done = TRUE, status = ?, body = ?, expires_us = ?
			WHERE tenant_id = ? AND idem_key = ? AND NOT done`,
		idemDrop: `DELETE FROM idempotency_records WHERE tenant_id = ? AND idem_key = ? AND NOT done`,

		eventsPruned: `SELECT through FROM event_pruned WHERE singleton = 1`,
		lastEvent:    `SELECT coalesce(max(id), 0) FROM events`,
		// pruneEvents deletes a prefix of the log, never its newest event:
		// the events up to the newest one older than the cutoff.
		// The log's ids and times increase together (but for clock skew
		// between replicas), so the first event young enough to keep ends
		// the prefix pruning deletes; the scan to it reads only what is
		// deleted.
		firstKept:   `SELECT id FROM events WHERE at_us >= ? ORDER BY id LIMIT 1`,
		pruneEvents: `DELETE FROM events WHERE id <= ?`,
		// The deliveries of pruned events go with them.
		pruneDeliveries: `DELETE FROM webhook_deliveries WHERE event_id <= ?`,
		pruneMark:       `UPDATE event_pruned SET through = ? WHERE singleton = 1 AND through < ?`,

		cursorInit:  `INSERT INTO webhook_cursors (endpoint, after_id) VALUES (?, ?) ON CONFLICT DO NOTHING`,
		cursorGet:   `SELECT after_id FROM webhook_cursors WHERE endpoint = ?`,
		cursorSet:   `UPDATE webhook_cursors SET after_id = ? WHERE endpoint = ?`,
		eventsAfter: `SELECT ` + eventCols + ` FROM events WHERE id > ? ORDER BY id LIMIT ?`,
		eventByID:   `SELECT ` + eventCols + ` FROM events WHERE id = ?`,
		deliveryInsert: `INSERT INTO webhook_deliveries (endpoint, event_id, tenant_id, status, next_us, created_us, updated_us)
			VALUES (?, ?, ?, 'pending', ?, ?, ?) ON CONFLICT DO NOTHING`,
		deliveryDue: `SELECT endpoint, event_id FROM webhook_deliveries
			WHERE status = 'pending' AND next_us <= ? AND (lock_until_us IS NULL OR lock_until_us <= ?)
			ORDER BY next_us, event_id LIMIT ?`,
		deliveryLock: `UPDATE webhook_deliveries SET lock_owner = ?, lock_until_us = ?
			WHERE endpoint = ? AND event_id = ? AND status = 'pending' AND (lock_until_us IS NULL OR lock_until_us <= ?)`,
		deliveryFinish: `UPDATE webhook_deliveries SET status = ?, attempts = attempts + 1, next_us = ?, last_status = ?,
			last_error = ?, lock_owner = NULL, lock_until_us = NULL, updated_us = ?
			WHERE endpoint = ? AND event_id = ? AND lock_owner = ? AND status = 'pending'`,
		dCounts: `SELECT endpoint, status, count(*) AS n FROM webhook_deliveries GROUP BY endpoint, status`,
	}
	q.candidateRaw = q.candidate
	if d.RowLock != "" {
		q.skipLocked, q.waitLocked = " "+d.RowLock+" SKIP LOCKED", " "+d.RowLock
		// The cursor's row lock serializes an endpoint's enqueues; due
		// deliveries another deliverer is leasing are skipped.
		q.cursorGet += " " + d.RowLock
		q.deliveryDue += q.skipLocked
	}
	if d.WritableCTE {
		// The cell's compare-and-set also requires a ready member, so an
		// autocommitted claimAlone writes all of it or nothing. The
		// statement also returns the inventory's next candidate, the hint
		// the next claim alone starts from (its snapshot still shows the
		// leased cell as ready, hence the exclusion).
		leased := `WITH leased AS (` + q.leaseCell + ` AND (pool_name IS NULL OR EXISTS (SELECT 1 FROM pool_members pm
				WHERE pm.cell_id = cells.id AND pm.pool_name = cells.pool_name AND pm.state = 'ready'))
				RETURNING id, pool_name, lease_id),
			member AS (UPDATE pool_members SET state = 'leased', updated_us = ?, event_reason = 'claimed'
				WHERE cell_id = (SELECT id FROM leased WHERE pool_name IS NOT NULL) AND state = 'ready' RETURNING cell_id)`
		result := ` SELECT (SELECT count(*) FROM leased), (SELECT count(*) FROM member), n.id, n.pool_name, n.ready_deadline_us
			FROM (SELECT 1) AS one LEFT JOIN LATERAL (` + q.candidate + ` AND c.id <> ?` + q.candidateOrder + `) n ON TRUE`
		q.leaseAll = leased + result
		q.leaseAllFenced = leased + `, fence AS (INSERT INTO claim_fences (tenant_id, claim_id, request_digest, lease_id, created_us)
				SELECT ?, ?, ?, lease_id, ? FROM leased RETURNING claim_id)` + result
	}
	for _, p := range q.all() {
		*p = db.Rebind(*p)
	}
	q.candidatePeek = q.candidate + q.candidateOrder
	q.candidateQueue = q.candidate + oldestFirst + " LIMIT " + strconv.Itoa(hintDepth)
	q.candidateSkip = q.candidate + q.candidateOrder + q.skipLocked
	q.candidateWait = q.candidate + q.candidateOrder + q.waitLocked
	return q
}

// all points at every fixed query that needs rebinding.
func (q *queries) all() []*string {
	return []*string{
		&q.schemaVersion, &q.installation, &q.fence, &q.candidate, &q.readyMembers, &q.leaseCell, &q.fenceInsert, &q.fenceEmpty, &q.memberLeased,
		&q.recordByLease, &q.cellByWorker, &q.claimOfCell, &q.quarantine, &q.renew, &q.toTerminal,
		&q.prepare, &q.expireReady, &q.expireLeased, &q.expireIdempotency, &q.memberInsert, &q.memberLive, &q.memberAdmit,
		&q.cellInsertPool, &q.memberStop, &q.memberByID, &q.memberCleanup, &q.memberDone, &q.memberLock,
		&q.memberUnlock, &q.memberCounts, &q.cellCounts, &q.readyCount, &q.inventory, &q.evidence, &q.memberVerified,
		&q.idemUpsert, &q.idemGet, &q.idemFinish, &q.idemDrop,
		&q.eventsPruned, &q.lastEvent, &q.firstKept, &q.pruneEvents, &q.pruneMark, &q.pruneDeliveries,
		&q.cursorInit, &q.cursorGet, &q.cursorSet, &q.eventsAfter, &q.eventByID,
		&q.deliveryInsert, &q.deliveryDue, &q.deliveryLock, &q.deliveryFinish, &q.dCounts,
		&q.leaseAll, &q.leaseAllFenced,
	}
}

// fixed lists every complete fixed query, the statements a pool prepares.
func (q queries) fixed() []string {
	out := []string{q.candidatePeek, q.candidateSkip, q.candidateWait, q.candidateQueue}
	for _, p := range q.all() {
		if *p != q.candidate { // a fragment: candidateSkip and candidateWait complete it
			out = append(out, *p)
		}
	}
	return out
}
