-- Lease renewal (CONTRACT §20): a renewal moves a live lease's expiry
-- later and changes nothing else.
--   * lease_expires_us is the lease's current expiry. The guard lets it
--     grow while the cell stays leased; it never shrinks, and no other
--     column of a lease changes once set.
--   * lease_granted_us keeps the expiry the claim granted, which the
--     lease attestation's MAC covers: NULL until the first renewal, which
--     sets it to the expiry it replaces; never changed after. A fenced
--     claim retry regenerates the attestation from it.
--   * leased_us is when the claim leased the cell, from which a pool's
--     max_cell_seconds counts. Leases made before this migration have
--     none, and cannot be renewed past their expiry.
--   * A renewal that moved the expiry appends lease.renewed (reason
--     renewed) in its transaction, as every change appends its events.

-- +goose Up
ALTER TABLE cells ADD COLUMN lease_granted_us INTEGER;
ALTER TABLE cells ADD COLUMN leased_us INTEGER;

DROP TRIGGER cells_transition;
-- +goose StatementBegin
CREATE TRIGGER cells_transition BEFORE UPDATE OF state, generation, lease_id, organization_id, workspace_id,
    thread_id, runner_session_id, lease_expires_us, attestation_digest, claim_id, retired_us,
    lease_granted_us, leased_us ON cells
WHEN (NEW.state <> OLD.state AND NOT (
        (OLD.state = 'ready' AND NEW.state IN ('leased', 'quarantined')) OR
        (OLD.state = 'leased' AND NEW.state IN ('destroyed', 'quarantined'))))
  OR (NEW.generation <> OLD.generation AND NOT (OLD.state = 'ready' AND NEW.state = 'leased'))
  OR (OLD.retired_us IS NOT NULL AND NEW.retired_us IS NOT OLD.retired_us)
  OR (OLD.lease_id IS NOT NULL AND (NEW.lease_id IS NOT OLD.lease_id
        OR NEW.organization_id IS NOT OLD.organization_id OR NEW.workspace_id IS NOT OLD.workspace_id
        OR NEW.thread_id IS NOT OLD.thread_id OR NEW.runner_session_id IS NOT OLD.runner_session_id
        OR NEW.attestation_digest IS NOT OLD.attestation_digest
        OR NEW.claim_id IS NOT OLD.claim_id OR NEW.leased_us IS NOT OLD.leased_us
        OR (NEW.lease_expires_us IS NOT OLD.lease_expires_us AND NOT (OLD.state = 'leased'
            AND NEW.state = 'leased' AND NEW.lease_expires_us > OLD.lease_expires_us))
        OR (NEW.lease_granted_us IS NOT OLD.lease_granted_us AND NOT (OLD.lease_granted_us IS NULL
            AND NEW.lease_granted_us = OLD.lease_expires_us))))
BEGIN
    SELECT RAISE(ABORT, 'illegal sterile cell transition');
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER cells_event_renewed AFTER UPDATE OF lease_expires_us ON cells
WHEN NEW.lease_expires_us > OLD.lease_expires_us
BEGIN
    INSERT INTO events (type, at_us, tenant_id, pool_name, cell_id, lease_id, generation, reason)
    VALUES ('lease.renewed', NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.id, NEW.lease_id,
            NEW.generation, 'renewed');
END;
-- +goose StatementEnd

-- +goose Down
DROP TRIGGER cells_event_renewed;
DROP TRIGGER cells_transition;
-- +goose StatementBegin
CREATE TRIGGER cells_transition BEFORE UPDATE OF state, generation, lease_id, organization_id, workspace_id,
    thread_id, runner_session_id, lease_expires_us, attestation_digest, claim_id, retired_us ON cells
WHEN (NEW.state <> OLD.state AND NOT (
        (OLD.state = 'ready' AND NEW.state IN ('leased', 'quarantined')) OR
        (OLD.state = 'leased' AND NEW.state IN ('destroyed', 'quarantined'))))
  OR (NEW.generation <> OLD.generation AND NOT (OLD.state = 'ready' AND NEW.state = 'leased'))
  OR (OLD.retired_us IS NOT NULL AND NEW.retired_us IS NOT OLD.retired_us)
  OR (OLD.lease_id IS NOT NULL AND (NEW.lease_id IS NOT OLD.lease_id
        OR NEW.organization_id IS NOT OLD.organization_id OR NEW.workspace_id IS NOT OLD.workspace_id
        OR NEW.thread_id IS NOT OLD.thread_id OR NEW.runner_session_id IS NOT OLD.runner_session_id
        OR NEW.lease_expires_us IS NOT OLD.lease_expires_us OR NEW.attestation_digest IS NOT OLD.attestation_digest
        OR NEW.claim_id IS NOT OLD.claim_id))
BEGIN
    SELECT RAISE(ABORT, 'illegal sterile cell transition');
END;
-- +goose StatementEnd
ALTER TABLE cells DROP COLUMN leased_us;
ALTER TABLE cells DROP COLUMN lease_granted_us;
