-- The Postgres half of the SQLite migration of the same number (8 there),
-- which explains lease renewal's columns, guard and event. The event takes
-- the log's advisory lock and its id from the sequence, as every append
-- does (migration 5).

-- +goose Up
ALTER TABLE cells ADD COLUMN lease_granted_us BIGINT;
ALTER TABLE cells ADD COLUMN leased_us BIGINT;

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION cells_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'sterile cells are never deleted';
    END IF;
    IF (NEW.state <> OLD.state AND NOT (
            (OLD.state = 'ready' AND NEW.state IN ('leased', 'quarantined')) OR
            (OLD.state = 'leased' AND NEW.state IN ('destroyed', 'quarantined'))))
       OR (NEW.generation <> OLD.generation AND NOT (OLD.state = 'ready' AND NEW.state = 'leased'))
       OR (OLD.retired_us IS NOT NULL AND NEW.retired_us IS DISTINCT FROM OLD.retired_us)
       OR NEW.id <> OLD.id OR NEW.tenant_id <> OLD.tenant_id OR NEW.worker_id <> OLD.worker_id
       OR NEW.pool_name IS DISTINCT FROM OLD.pool_name OR NEW.provider_cell_id <> OLD.provider_cell_id
       OR NEW.release_set_id <> OLD.release_set_id OR NEW.runtime_class <> OLD.runtime_class
       OR NEW.policy_digest <> OLD.policy_digest OR NEW.release_signature <> OLD.release_signature
       OR NEW.ready_deadline_us <> OLD.ready_deadline_us OR NEW.created_us <> OLD.created_us
       OR (OLD.lease_id IS NOT NULL AND (NEW.lease_id IS DISTINCT FROM OLD.lease_id
            OR NEW.organization_id IS DISTINCT FROM OLD.organization_id
            OR NEW.workspace_id IS DISTINCT FROM OLD.workspace_id
            OR NEW.thread_id IS DISTINCT FROM OLD.thread_id
            OR NEW.runner_session_id IS DISTINCT FROM OLD.runner_session_id
            OR NEW.attestation_digest IS DISTINCT FROM OLD.attestation_digest
            OR NEW.claim_id IS DISTINCT FROM OLD.claim_id
            OR NEW.leased_us IS DISTINCT FROM OLD.leased_us
            OR (NEW.lease_expires_us IS DISTINCT FROM OLD.lease_expires_us AND NOT (OLD.state = 'leased'
                AND NEW.state = 'leased' AND NEW.lease_expires_us > OLD.lease_expires_us))
            OR (NEW.lease_granted_us IS DISTINCT FROM OLD.lease_granted_us AND NOT (OLD.lease_granted_us IS NULL
                AND NEW.lease_granted_us = OLD.lease_expires_us))))
    THEN
        RAISE EXCEPTION 'illegal sterile cell transition (% -> %)', OLD.state, NEW.state;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION cells_renewed_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(1398228822, hashtext(current_schema()));
    INSERT INTO events (id, type, at_us, tenant_id, pool_name, cell_id, lease_id, generation, reason)
    VALUES (nextval('events_id_seq'), 'lease.renewed', NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.id,
            NEW.lease_id, NEW.generation, 'renewed');
    RETURN NULL;
END
$$;
-- +goose StatementEnd

CREATE TRIGGER cells_event_renewed AFTER UPDATE OF lease_expires_us ON cells
    FOR EACH ROW WHEN (NEW.lease_expires_us > OLD.lease_expires_us) EXECUTE FUNCTION cells_renewed_event();

-- +goose Down
DROP TRIGGER cells_event_renewed ON cells;
DROP FUNCTION cells_renewed_event();

-- +goose StatementBegin
CREATE OR REPLACE FUNCTION cells_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'sterile cells are never deleted';
    END IF;
    IF (NEW.state <> OLD.state AND NOT (
            (OLD.state = 'ready' AND NEW.state IN ('leased', 'quarantined')) OR
            (OLD.state = 'leased' AND NEW.state IN ('destroyed', 'quarantined'))))
       OR (NEW.generation <> OLD.generation AND NOT (OLD.state = 'ready' AND NEW.state = 'leased'))
       OR (OLD.retired_us IS NOT NULL AND NEW.retired_us IS DISTINCT FROM OLD.retired_us)
       OR NEW.id <> OLD.id OR NEW.tenant_id <> OLD.tenant_id OR NEW.worker_id <> OLD.worker_id
       OR NEW.pool_name IS DISTINCT FROM OLD.pool_name OR NEW.provider_cell_id <> OLD.provider_cell_id
       OR NEW.release_set_id <> OLD.release_set_id OR NEW.runtime_class <> OLD.runtime_class
       OR NEW.policy_digest <> OLD.policy_digest OR NEW.release_signature <> OLD.release_signature
       OR NEW.ready_deadline_us <> OLD.ready_deadline_us OR NEW.created_us <> OLD.created_us
       OR (OLD.lease_id IS NOT NULL AND (NEW.lease_id IS DISTINCT FROM OLD.lease_id
            OR NEW.organization_id IS DISTINCT FROM OLD.organization_id
            OR NEW.workspace_id IS DISTINCT FROM OLD.workspace_id
            OR NEW.thread_id IS DISTINCT FROM OLD.thread_id
            OR NEW.runner_session_id IS DISTINCT FROM OLD.runner_session_id
            OR NEW.lease_expires_us IS DISTINCT FROM OLD.lease_expires_us
            OR NEW.attestation_digest IS DISTINCT FROM OLD.attestation_digest
            OR NEW.claim_id IS DISTINCT FROM OLD.claim_id))
    THEN
        RAISE EXCEPTION 'illegal sterile cell transition (% -> %)', OLD.state, NEW.state;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

ALTER TABLE cells DROP COLUMN leased_us;
ALTER TABLE cells DROP COLUMN lease_granted_us;
