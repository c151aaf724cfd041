-- A claim's commit writes one WAL frame per B-tree page it changed, and on
-- SQLite those frames, not the statements, are most of a claim's cost
-- (docs/performance.md). This migration makes a lease change fewer B-trees:
--   * claim_fences is WITHOUT ROWID: its primary key is the table, one
--     B-tree instead of two;
--   * a cell records the claim_id that leased it, which is all the
--     lease-to-fence lookup wanted: claim_fences loses its lease_id index
--     and the foreign key that needed it (the claim writes both rows in one
--     transaction);
--   * cells.lease_id is unique through a partial index, which holds no
--     entry for an unleased cell;
--   * cells.retired_us records when a cell became terminal, so the
--     index unmanaged ready cells expire by can hold every live unmanaged
--     cell by its ready deadline: a lease no longer changes it (its
--     predicate used to name state);
--   * the state CHECK compares instead of building an IN table per
--     statement;
--   * the guard is two triggers: what a cell is (fires only for statements
--     that set those columns, which ours never do) and how it moves on.
-- Both tables are rebuilt: SQLite cannot alter a column constraint.

-- +goose Up
CREATE TABLE claim_fences_v2 (
    tenant_id      TEXT    NOT NULL,
    claim_id       TEXT    NOT NULL,
    request_digest TEXT    NOT NULL,
    lease_id       TEXT,
    created_us     INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, claim_id)
) WITHOUT ROWID;
INSERT INTO claim_fences_v2 (tenant_id, claim_id, request_digest, lease_id, created_us)
    SELECT tenant_id, claim_id, request_digest, lease_id, created_us FROM claim_fences;
DROP TABLE claim_fences;
ALTER TABLE claim_fences_v2 RENAME TO claim_fences;

CREATE TABLE cells_v2 (
    id                 TEXT    PRIMARY KEY,
    tenant_id          TEXT    NOT NULL,
    worker_id          TEXT    NOT NULL,
    pool_name          TEXT,
    provider_cell_id   TEXT    NOT NULL,
    state              TEXT    NOT NULL
        CHECK (state = 'ready' OR state = 'leased' OR state = 'destroyed' OR state = 'quarantined'),
    generation         INTEGER NOT NULL CHECK (generation IN (1, 2)),
    release_set_id     TEXT    NOT NULL,
    runtime_class      TEXT    NOT NULL CHECK (runtime_class IN ('kata_microvm', 'gvisor_lower_risk')),
    policy_digest      TEXT    NOT NULL,
    release_signature  TEXT    NOT NULL,
    ready_deadline_us  INTEGER NOT NULL,
    created_us         INTEGER NOT NULL,
    updated_us         INTEGER NOT NULL,
    lease_id           TEXT,
    organization_id    TEXT,
    workspace_id       TEXT,
    thread_id          TEXT,
    runner_session_id  TEXT,
    lease_expires_us   INTEGER,
    attestation_digest TEXT,
    claim_id           TEXT,
    retired_us         INTEGER,
    UNIQUE (worker_id, provider_cell_id),
    CHECK (state <> 'ready' OR generation = 1),
    CHECK (state <> 'leased' OR generation = 2),
    CHECK ((generation = 2) = (lease_id IS NOT NULL)),
    CHECK (lease_id IS NULL OR (organization_id IS NOT NULL AND workspace_id IS NOT NULL AND thread_id IS NOT NULL
        AND runner_session_id IS NOT NULL AND lease_expires_us IS NOT NULL AND length(attestation_digest) = 64)),
    CHECK (lease_id IS NOT NULL OR (organization_id IS NULL AND workspace_id IS NULL AND thread_id IS NULL
        AND runner_session_id IS NULL AND lease_expires_us IS NULL AND attestation_digest IS NULL)),
    CHECK (claim_id IS NULL OR lease_id IS NOT NULL),
    CHECK ((state = 'destroyed' OR state = 'quarantined') = (retired_us IS NOT NULL))
);
INSERT INTO cells_v2 (id, tenant_id, worker_id, pool_name, provider_cell_id, state, generation, release_set_id,
        runtime_class, policy_digest, release_signature, ready_deadline_us, created_us, updated_us, lease_id,
        organization_id, workspace_id, thread_id, runner_session_id, lease_expires_us, attestation_digest, claim_id,
        retired_us)
    SELECT c.id, c.tenant_id, c.worker_id, c.pool_name, c.provider_cell_id, c.state, c.generation, c.release_set_id,
        c.runtime_class, c.policy_digest, c.release_signature, c.ready_deadline_us, c.created_us, c.updated_us,
        c.lease_id, c.organization_id, c.workspace_id, c.thread_id, c.runner_session_id, c.lease_expires_us,
        c.attestation_digest, f.claim_id,
        CASE WHEN c.state IN ('destroyed', 'quarantined') THEN c.updated_us END
    FROM cells c LEFT JOIN claim_fences f ON f.lease_id = c.lease_id;
DROP TABLE cells;
ALTER TABLE cells_v2 RENAME TO cells;

CREATE UNIQUE INDEX cells_lease ON cells (lease_id) WHERE lease_id IS NOT NULL;
CREATE INDEX cells_claimable ON cells (tenant_id, runtime_class, release_set_id, policy_digest, release_signature, created_us, id)
    WHERE state = 'ready';
CREATE INDEX cells_unmanaged_live ON cells (ready_deadline_us) WHERE pool_name IS NULL AND retired_us IS NULL;
CREATE INDEX cells_unmanaged_leased ON cells (lease_expires_us) WHERE state = 'leased' AND pool_name IS NULL;

-- +goose StatementBegin
CREATE TRIGGER cells_never_deleted BEFORE DELETE ON cells
BEGIN
    SELECT RAISE(ABORT, 'sterile cells are never deleted');
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER cells_identity BEFORE UPDATE OF id, tenant_id, worker_id, pool_name, provider_cell_id,
    release_set_id, runtime_class, policy_digest, release_signature, ready_deadline_us, created_us ON cells
WHEN NEW.id <> OLD.id OR NEW.tenant_id <> OLD.tenant_id OR NEW.worker_id <> OLD.worker_id
  OR NEW.pool_name IS NOT OLD.pool_name OR NEW.provider_cell_id <> OLD.provider_cell_id
  OR NEW.release_set_id <> OLD.release_set_id OR NEW.runtime_class <> OLD.runtime_class
  OR NEW.policy_digest <> OLD.policy_digest OR NEW.release_signature <> OLD.release_signature
  OR NEW.ready_deadline_us <> OLD.ready_deadline_us OR NEW.created_us <> OLD.created_us
BEGIN
    SELECT RAISE(ABORT, 'illegal sterile cell transition');
END;
-- +goose StatementEnd

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

-- +goose Down
CREATE TABLE cells_v1 (
    id                 TEXT    PRIMARY KEY,
    tenant_id          TEXT    NOT NULL,
    worker_id          TEXT    NOT NULL,
    pool_name          TEXT,
    provider_cell_id   TEXT    NOT NULL,
    state              TEXT    NOT NULL CHECK (state IN ('ready', 'leased', 'destroyed', 'quarantined')),
    generation         INTEGER NOT NULL CHECK (generation IN (1, 2)),
    release_set_id     TEXT    NOT NULL,
    runtime_class      TEXT    NOT NULL CHECK (runtime_class IN ('kata_microvm', 'gvisor_lower_risk')),
    policy_digest      TEXT    NOT NULL,
    release_signature  TEXT    NOT NULL,
    ready_deadline_us  INTEGER NOT NULL,
    created_us         INTEGER NOT NULL,
    updated_us         INTEGER NOT NULL,
    lease_id           TEXT    UNIQUE,
    organization_id    TEXT,
    workspace_id       TEXT,
    thread_id          TEXT,
    runner_session_id  TEXT,
    lease_expires_us   INTEGER,
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
INSERT INTO cells_v1 (id, tenant_id, worker_id, pool_name, provider_cell_id, state, generation, release_set_id,
        runtime_class, policy_digest, release_signature, ready_deadline_us, created_us, updated_us, lease_id,
        organization_id, workspace_id, thread_id, runner_session_id, lease_expires_us, attestation_digest)
    SELECT id, tenant_id, worker_id, pool_name, provider_cell_id, state, generation, release_set_id,
        runtime_class, policy_digest, release_signature, ready_deadline_us, created_us, updated_us, lease_id,
        organization_id, workspace_id, thread_id, runner_session_id, lease_expires_us, attestation_digest
    FROM cells;
DROP TABLE cells;
ALTER TABLE cells_v1 RENAME TO cells;
CREATE INDEX cells_claimable ON cells (tenant_id, runtime_class, release_set_id, policy_digest, release_signature, created_us, id)
    WHERE state = 'ready';
CREATE INDEX cells_unmanaged_ready ON cells (ready_deadline_us) WHERE state = 'ready' AND pool_name IS NULL;
CREATE INDEX cells_unmanaged_leased ON cells (lease_expires_us) WHERE state = 'leased' AND pool_name IS NULL;

-- +goose StatementBegin
CREATE TRIGGER cells_never_deleted BEFORE DELETE ON cells
BEGIN
    SELECT RAISE(ABORT, 'sterile cells are never deleted');
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER cells_transition BEFORE UPDATE ON cells
WHEN (NEW.state <> OLD.state AND NOT (
        (OLD.state = 'ready' AND NEW.state IN ('leased', 'quarantined')) OR
        (OLD.state = 'leased' AND NEW.state IN ('destroyed', 'quarantined'))))
  OR (NEW.generation <> OLD.generation AND NOT (OLD.state = 'ready' AND NEW.state = 'leased'))
  OR NEW.id <> OLD.id OR NEW.tenant_id <> OLD.tenant_id OR NEW.worker_id <> OLD.worker_id
  OR NEW.pool_name IS NOT OLD.pool_name OR NEW.provider_cell_id <> OLD.provider_cell_id
  OR NEW.release_set_id <> OLD.release_set_id OR NEW.runtime_class <> OLD.runtime_class
  OR NEW.policy_digest <> OLD.policy_digest OR NEW.release_signature <> OLD.release_signature
  OR NEW.ready_deadline_us <> OLD.ready_deadline_us OR NEW.created_us <> OLD.created_us
  OR (OLD.lease_id IS NOT NULL AND (NEW.lease_id IS NOT OLD.lease_id
        OR NEW.organization_id IS NOT OLD.organization_id OR NEW.workspace_id IS NOT OLD.workspace_id
        OR NEW.thread_id IS NOT OLD.thread_id OR NEW.runner_session_id IS NOT OLD.runner_session_id
        OR NEW.lease_expires_us IS NOT OLD.lease_expires_us OR NEW.attestation_digest IS NOT OLD.attestation_digest))
BEGIN
    SELECT RAISE(ABORT, 'illegal sterile cell transition');
END;
-- +goose StatementEnd

CREATE TABLE claim_fences_v1 (
    tenant_id      TEXT    NOT NULL,
    claim_id       TEXT    NOT NULL,
    request_digest TEXT    NOT NULL,
    lease_id       TEXT    REFERENCES cells (lease_id),
    created_us     INTEGER NOT NULL,
    PRIMARY KEY (tenant_id, claim_id)
);
INSERT INTO claim_fences_v1 (tenant_id, claim_id, request_digest, lease_id, created_us)
    SELECT tenant_id, claim_id, request_digest, lease_id, created_us FROM claim_fences;
DROP TABLE claim_fences;
ALTER TABLE claim_fences_v1 RENAME TO claim_fences;
CREATE INDEX claim_fences_lease ON claim_fences (lease_id) WHERE lease_id IS NOT NULL;
