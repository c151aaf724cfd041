-- The Postgres half of the SQLite migration of the same number, which
-- explains the why; both keep the columns the shared queries use.
--   * A cell records the claim_id that leased it, which is all the
--     lease-to-fence lookup wanted: claim_fences loses its lease_id index,
--     one index fewer for every fenced claim to write. The foreign key
--     stays: Postgres checks it from the fence side, and a cell's lease_id
--     never changes once set, so the referencing side needs no index.
--   * cells.retired_us records when a cell became terminal. SQLite indexes
--     live unmanaged cells by it; here the expiry indexes stay partial on
--     state, which suits Postgres better (a lease writes a new tuple, and
--     an index gets an entry only where its predicate holds).

-- +goose Up
ALTER TABLE cells ADD COLUMN claim_id TEXT CHECK (claim_id IS NULL OR lease_id IS NOT NULL);
UPDATE cells SET claim_id = f.claim_id FROM claim_fences f WHERE f.lease_id = cells.lease_id;
ALTER TABLE cells ADD COLUMN retired_us BIGINT;
UPDATE cells SET retired_us = updated_us WHERE state IN ('destroyed', 'quarantined');
ALTER TABLE cells ADD CONSTRAINT cells_retired CHECK ((state IN ('destroyed', 'quarantined')) = (retired_us IS NOT NULL));
DROP INDEX claim_fences_lease;

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

-- +goose Down
CREATE INDEX claim_fences_lease ON claim_fences (lease_id) WHERE lease_id IS NOT NULL;

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
            OR NEW.attestation_digest IS DISTINCT FROM OLD.attestation_digest))
    THEN
        RAISE EXCEPTION 'illegal sterile cell transition (% -> %)', OLD.state, NEW.state;
    END IF;
    RETURN NEW;
END
$$;
-- +goose StatementEnd

ALTER TABLE cells DROP COLUMN retired_us;
ALTER TABLE cells DROP COLUMN claim_id;
