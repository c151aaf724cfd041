-- The Postgres half of the SQLite migration of the same number, which
-- explains the log and its triggers. What differs is how ids are handed
-- out. A sequence alone would not do: its values are taken in one order and
-- committed in another, so a reader could see id 7 while the transaction
-- holding id 6 is still in flight, move past 6, and never see it. So every
-- append first takes a transaction-level advisory lock (one per schema),
-- then its id from the sequence: the lock is held until the appending
-- transaction ends, so the next appending transaction takes its ids only
-- after the previous one is committed and visible (Postgres releases a
-- transaction's locks after making its commit visible). Ids therefore
-- commit in their order: a reader that has seen id n has seen every id
-- below it that will ever commit (a rolled-back append leaves a gap, never
-- a late arrival). The sequence must not cache values per session (CACHE
-- 1). The cost is that appends — the state changes of every replica —
-- commit one at a time from their first event to their commit; the
-- statements of the store change a state last, or nearly, in their
-- transaction, so the wait is mostly the commit itself (docs/performance.md,
-- and storetest's concurrent readers prove the order). A counter row
-- updated by every append would serialize the same way, but a transaction
-- that appends many events (a bulk expiry) would update one row that many
-- times, each update walking the versions the transaction left before it.

-- +goose Up
ALTER TABLE cells ADD COLUMN event_reason TEXT;
ALTER TABLE pool_members ADD COLUMN event_reason TEXT;

CREATE TABLE events (
    id              BIGINT  PRIMARY KEY,
    type            TEXT    NOT NULL,
    at_us           BIGINT  NOT NULL,
    tenant_id       TEXT    NOT NULL,
    pool_name       TEXT,
    cell_id         TEXT    NOT NULL,
    lease_id        TEXT,
    member_id       TEXT,
    generation      SMALLINT,
    from_state      TEXT,
    to_state        TEXT,
    disposition     TEXT,
    provider_absent BOOLEAN NOT NULL DEFAULT FALSE,
    reason          TEXT
);

CREATE SEQUENCE events_id_seq AS BIGINT CACHE 1 NO CYCLE;

CREATE TABLE event_pruned (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    through   BIGINT  NOT NULL
);
INSERT INTO event_pruned (singleton, through) VALUES (1, 0);

-- +goose StatementBegin
CREATE FUNCTION cells_event() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- 1398228822: "SWEV"; the second key keeps schemas apart.
    PERFORM pg_advisory_xact_lock(1398228822, hashtext(current_schema()));
    INSERT INTO events (id, type, at_us, tenant_id, pool_name, cell_id, lease_id, generation, from_state, to_state, reason)
    VALUES (nextval('events_id_seq'), 'cell.' || NEW.state, NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.id,
            NEW.lease_id, NEW.generation, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state, NEW.event_reason);
    IF TG_OP = 'UPDATE' AND OLD.state = 'leased' AND NEW.event_reason IN ('expired', 'revoked') THEN
        INSERT INTO events (id, type, at_us, tenant_id, pool_name, cell_id, lease_id, generation, reason)
        VALUES (nextval('events_id_seq'), 'lease.' || NEW.event_reason, NEW.updated_us, NEW.tenant_id, NEW.pool_name,
                NEW.id, NEW.lease_id, NEW.generation, NEW.event_reason);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE FUNCTION pool_members_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    cell_lease TEXT;
    cell_generation SMALLINT;
BEGIN
    IF TG_OP = 'UPDATE' THEN
        SELECT c.lease_id, c.generation INTO cell_lease, cell_generation
            FROM cells c WHERE c.id = NEW.cell_id AND c.pool_name = NEW.pool_name;
    END IF;
    PERFORM pg_advisory_xact_lock(1398228822, hashtext(current_schema()));
    INSERT INTO events (id, type, at_us, tenant_id, pool_name, cell_id, lease_id, member_id, generation, from_state,
                        to_state, disposition, provider_absent, reason)
    VALUES (nextval('events_id_seq'), 'member.' || NEW.state, NEW.updated_us, NEW.tenant_id, NEW.pool_name, NEW.cell_id,
            coalesce(NEW.stop_lease_id, cell_lease), NEW.cell_id, coalesce(cell_generation, NEW.stop_generation),
            CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state, NEW.requested_disposition, NEW.provider_absent,
            NEW.event_reason);
    IF NEW.state = 'stopping' AND NEW.event_reason IN ('released', 'revoked', 'expired') THEN
        INSERT INTO events (id, type, at_us, tenant_id, pool_name, cell_id, lease_id, member_id, generation, disposition, reason)
        VALUES (nextval('events_id_seq'), 'lease.' || NEW.event_reason, NEW.updated_us, NEW.tenant_id, NEW.pool_name,
                NEW.cell_id, NEW.stop_lease_id, NEW.cell_id, NEW.stop_generation, NEW.requested_disposition, NEW.event_reason);
    END IF;
    RETURN NULL;
END
$$;
-- +goose StatementEnd

-- Only changes of state call the functions.
CREATE TRIGGER cells_event_insert AFTER INSERT ON cells
    FOR EACH ROW EXECUTE FUNCTION cells_event();
CREATE TRIGGER cells_event_update AFTER UPDATE OF state ON cells
    FOR EACH ROW WHEN (NEW.state <> OLD.state) EXECUTE FUNCTION cells_event();
CREATE TRIGGER pool_members_event_insert AFTER INSERT ON pool_members
    FOR EACH ROW EXECUTE FUNCTION pool_members_event();
CREATE TRIGGER pool_members_event_update AFTER UPDATE OF state ON pool_members
    FOR EACH ROW WHEN (NEW.state <> OLD.state) EXECUTE FUNCTION pool_members_event();

-- Webhook deliveries (CONTRACT §16): one row per event and endpoint, made
-- by the deliverer as it follows the log from its endpoint's cursor, and
-- leased to one deliverer at a time (lock_owner until lock_until_us).
CREATE TABLE webhook_cursors (
    endpoint TEXT   PRIMARY KEY,
    after_id BIGINT NOT NULL
);
CREATE TABLE webhook_deliveries (
    endpoint      TEXT    NOT NULL,
    event_id      BIGINT NOT NULL,
    tenant_id     TEXT    NOT NULL,
    status        TEXT    NOT NULL CHECK (status IN ('pending', 'delivered', 'failed')),
    attempts      INTEGER NOT NULL DEFAULT 0,
    next_us       BIGINT NOT NULL,
    lock_owner    TEXT,
    lock_until_us BIGINT,
    last_status   INTEGER NOT NULL DEFAULT 0,
    last_error    TEXT    NOT NULL DEFAULT '',
    created_us    BIGINT NOT NULL,
    updated_us    BIGINT NOT NULL,
    PRIMARY KEY (endpoint, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_us) WHERE status = 'pending';
CREATE INDEX webhook_deliveries_status ON webhook_deliveries (status, event_id);

-- +goose Down
DROP TABLE webhook_deliveries;
DROP TABLE webhook_cursors;
DROP TRIGGER pool_members_event_update ON pool_members;
DROP TRIGGER pool_members_event_insert ON pool_members;
DROP TRIGGER cells_event_update ON cells;
DROP TRIGGER cells_event_insert ON cells;
DROP FUNCTION pool_members_event();
DROP FUNCTION cells_event();
DROP TABLE event_pruned;
DROP TABLE events;
DROP SEQUENCE events_id_seq;
ALTER TABLE pool_members DROP COLUMN event_reason;
ALTER TABLE cells DROP COLUMN event_reason;
