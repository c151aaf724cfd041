-- Sterile cells, claim fences, pool memberships and idempotency records.
-- Times are Unix microseconds (BIGINT), the same on every dialect: exact
-- round-trips of what was signed, and one set of queries for both stores.
-- The trigger repeats the transition table of package lease, so that no
-- statement, ours or an operator's, can return a cell to inventory.

-- +goose Up
CREATE TABLE cells (
    id                 TEXT     PRIMARY KEY,
    tenant_id          TEXT     NOT NULL,
    worker_id          TEXT     NOT NULL,
    pool_name          TEXT,
    provider_cell_id   TEXT     NOT NULL,
    state              TEXT     NOT NULL CHECK (state IN ('ready', 'leased', 'destroyed', 'quarantined')),
    generation         SMALLINT NOT NULL CHECK (generation IN (1, 2)),
    release_set_id     TEXT     NOT NULL,
    runtime_class      TEXT     NOT NULL CHECK (runtime_class IN ('kata_microvm', 'gvisor_lower_risk')),
    policy_digest      TEXT     NOT NULL,
    release_signature  TEXT     NOT NULL,
    ready_deadline_us  BIGINT   NOT NULL,
    created_us         BIGINT   NOT NULL,
    updated_us         BIGINT   NOT NULL,
    lease_id           TEXT     UNIQUE,
    organization_id    TEXT,
    workspace_id       TEXT,
    thread_id          TEXT,
    runner_session_id  TEXT,
    lease_expires_us   BIGINT,
    attestation_digest TEXT,
    UNIQUE (worker_id, provider_cell_id),
    CHECK (state <> 'ready' OR generation = 1),
    CHECK (state <> 'leased' OR generation = 2),
    CHECK ((generation = 2) = (lease_id IS NOT NULL)),
    CHECK (lease_id IS NULL OR (organization_id IS NOT NULL AND workspace_id IS NOT NULL AND thread_id IS NOT NULL
        AND runner_session_id IS NOT NULL AND lease_expires_us IS NOT NULL AND length(attestation_digest) = 64)),
    CHECK (lease_id IS NOT NULL OR (organization_id IS NULL AND workspace_id IS NULL AND thread_id IS NULL
        AND runner_session_id IS NULL AND lease_expires_us IS NULL AND attestation_digest IS NULL))
);

CREATE INDEX cells_claimable ON cells (tenant_id, runtime_class, release_set_id, policy_digest, release_signature, created_us, id)
    WHERE state = 'ready';
CREATE INDEX cells_unmanaged_ready ON cells (ready_deadline_us) WHERE state = 'ready' AND pool_name IS NULL;
CREATE INDEX cells_unmanaged_leased ON cells (lease_expires_us) WHERE state = 'leased' AND pool_name IS NULL;

-- +goose StatementBegin
CREATE FUNCTION cells_guard() RETURNS trigger LANGUAGE plpgsql AS $$
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

CREATE TRIGGER cells_guard BEFORE UPDATE OR DELETE ON cells FOR EACH ROW EXECUTE FUNCTION cells_guard();

CREATE TABLE claim_fences (
    tenant_id      TEXT   NOT NULL,
    claim_id       TEXT   NOT NULL,
    request_digest TEXT   NOT NULL,
    lease_id       TEXT   REFERENCES cells (lease_id),
    created_us     BIGINT NOT NULL,
    PRIMARY KEY (tenant_id, claim_id)
);
CREATE INDEX claim_fences_lease ON claim_fences (lease_id) WHERE lease_id IS NOT NULL;

CREATE TABLE pool_members (
    cell_id               TEXT    PRIMARY KEY,
    pool_name             TEXT    NOT NULL,
    tenant_id             TEXT    NOT NULL,
    state                 TEXT    NOT NULL CHECK (state IN ('provisioning', 'ready', 'leased', 'stopping',
                                                            'cleanup_pending', 'destroyed', 'quarantined')),
    requested_disposition TEXT    CHECK (requested_disposition IN ('destroyed', 'quarantined')),
    stop_lease_id         TEXT,
    stop_generation       SMALLINT,
    provider_absent       BOOLEAN NOT NULL DEFAULT FALSE,
    identity              TEXT    NOT NULL DEFAULT '',
    last_error            TEXT    NOT NULL DEFAULT '',
    attempts              INTEGER NOT NULL DEFAULT 0,
    lock_owner            TEXT,
    lock_until_us         BIGINT,
    created_us            BIGINT  NOT NULL,
    updated_us            BIGINT  NOT NULL,
    CHECK (NOT provider_absent OR state IN ('destroyed', 'quarantined')),
    CHECK (state IN ('provisioning', 'ready', 'leased') OR (requested_disposition IS NOT NULL AND stop_generation IS NOT NULL))
);
CREATE INDEX pool_members_by_state ON pool_members (pool_name, state, created_us);

CREATE TABLE idempotency_records (
    tenant_id   TEXT    NOT NULL,
    idem_key    TEXT    NOT NULL,
    fingerprint TEXT    NOT NULL,
    done        BOOLEAN NOT NULL DEFAULT FALSE,
    status      INTEGER NOT NULL DEFAULT 0,
    body        TEXT    NOT NULL DEFAULT '',
    created_us  BIGINT  NOT NULL,
    expires_us  BIGINT  NOT NULL,
    PRIMARY KEY (tenant_id, idem_key)
);
CREATE INDEX idempotency_records_expiry ON idempotency_records (expires_us);

-- +goose Down
DROP TABLE idempotency_records;
DROP TABLE pool_members;
DROP TABLE claim_fences;
DROP TABLE cells;
DROP FUNCTION cells_guard();
