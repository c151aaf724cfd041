-- Lifecycle events (CONTRACT §16): a durable, ordered log written with the
-- change it describes.
--   * Triggers write it: every change of state of a cell or a pool member,
--     whichever statement makes it, appends its event in the statement's
--     own transaction. No code path can change a state and forget the
--     event.
--   * The statement names why in event_reason, a column of the row it
--     changes (a reason code of §16, or NULL); the trigger copies it.
--     Every statement that changes a state sets it.
--   * events.id is the rowid: SQLite's writers are serialized, so ids are
--     handed out in commit order, one more than the largest. Pruning
--     always keeps the newest event, so an id is never handed out twice.
--     event_pruned records the largest id pruning may have removed: a
--     reader behind it has missed events (410 events_expired).
--   * Only the primary key is indexed: a claim's commit writes one more
--     B-tree, the log's last page (docs/performance.md).

-- +goose Up
ALTER TABLE cells ADD COLUMN event_reason TEXT;
ALTER TABLE pool_members ADD COLUMN event_reason TEXT;

CREATE TABLE events (
    id              INTEGER PRIMARY KEY,
    type            TEXT    NOT NULL,
    at_us           INTEGER NOT NULL,
    tenant_id       TEXT    NOT NULL,
    pool_name       TEXT,
    cell_id         TEXT    NOT NULL,
    lease_id        TEXT,
    member_id       TEXT,
    generation      INTEGER,
    from_state      TEXT,
    to_state        TEXT,
    disposition     TEXT,
    provider_absent BOOLEAN NOT NULL DEFAULT FALSE,
    reason          TEXT
);

CREATE TABLE event_pruned (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    through   INTEGER NOT NULL
);
INSERT INTO event_pruned (singleton, through) VALUES (1, 0);

-- +goose StatementBegin
CREATE TRIGGER cells_event_insert AFTER INSERT ON cells
BEGIN
    INSERT INTO events (type, at_us, tenant_id, pool_name, cell_id, lease_id, generation, to_state, reason)
    VALUES ('cell.' || NEW.state, NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.id, NEW.lease_id,
            NEW.generation, NEW.state, NEW.event_reason);
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER cells_event_update AFTER UPDATE OF state ON cells
WHEN NEW.state <> OLD.state
BEGIN
    INSERT INTO events (type, at_us, tenant_id, pool_name, cell_id, lease_id, generation, from_state, to_state, reason)
    VALUES ('cell.' || NEW.state, NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.id, NEW.lease_id,
            NEW.generation, OLD.state, NEW.state, NEW.event_reason);
    INSERT INTO events (type, at_us, tenant_id, pool_name, cell_id, lease_id, generation, reason)
    SELECT 'lease.' || NEW.event_reason, NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.id, NEW.lease_id,
           NEW.generation, NEW.event_reason
    WHERE OLD.state = 'leased' AND NEW.event_reason IN ('expired', 'revoked');
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER pool_members_event_insert AFTER INSERT ON pool_members
BEGIN
    INSERT INTO events (type, at_us, tenant_id, pool_name, cell_id, member_id, to_state, reason)
    VALUES ('member.' || NEW.state, NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.cell_id, NEW.cell_id,
            NEW.state, NEW.event_reason);
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER pool_members_event_update AFTER UPDATE OF state ON pool_members
WHEN NEW.state <> OLD.state
BEGIN
    INSERT INTO events (type, at_us, tenant_id, pool_name, cell_id, lease_id, member_id, generation,
                        from_state, to_state, disposition, provider_absent, reason)
    SELECT 'member.' || NEW.state, NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.cell_id,
           coalesce(NEW.stop_lease_id, c.lease_id), NEW.cell_id, coalesce(c.generation, NEW.stop_generation),
           OLD.state, NEW.state, NEW.requested_disposition, NEW.provider_absent, NEW.event_reason
    FROM (SELECT 1) LEFT JOIN cells c ON c.id = NEW.cell_id AND c.pool_name = NEW.pool_name;
    INSERT INTO events (type, at_us, tenant_id, pool_name, cell_id, lease_id, member_id, generation, disposition, reason)
    SELECT 'lease.' || NEW.event_reason, NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.cell_id,
           NEW.stop_lease_id, NEW.cell_id, NEW.stop_generation, NEW.requested_disposition, NEW.event_reason
    WHERE NEW.state = 'stopping' AND NEW.event_reason IN ('released', 'revoked', 'expired');
END;
-- +goose StatementEnd

-- Webhook deliveries (CONTRACT §16): one row per event and endpoint, made
-- by the deliverer as it follows the log from its endpoint's cursor, and
-- leased to one deliverer at a time (lock_owner until lock_until_us).
CREATE TABLE webhook_cursors (
    endpoint TEXT   PRIMARY KEY,
    after_id INTEGER NOT NULL
);
CREATE TABLE webhook_deliveries (
    endpoint      TEXT    NOT NULL,
    event_id      INTEGER NOT NULL,
    tenant_id     TEXT    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    next_us       INTEGER NOT NULL,
    lock_owner    TEXT,
    lock_until_us INTEGER,
    last_status   INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT    NOT NULL DEFAULT '',
    created_us    INTEGER NOT NULL,
    updated_us    INTEGER NOT NULL,
    PRIMARY KEY (endpoint, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_us) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_status ON webhook_deliveries (status, event_id);

-- +goose Down
DROP TABLE webhook_deliveries;
DROP TABLE webhook_cursors;
DROP TRIGGER pool_members_event_update;
DROP TRIGGER pool_members_event_insert;
DROP TRIGGER cells_event_update;
DROP TRIGGER cells_event_insert;
DROP TABLE event_pruned;
DROP TABLE events;
ALTER TABLE pool_members DROP COLUMN event_reason;
ALTER TABLE cells DROP COLUMN event_reason;
