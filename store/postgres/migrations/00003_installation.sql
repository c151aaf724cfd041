-- The Postgres half of the SQLite migration of the same number: one row
-- naming this plane's database, created here from a random UUID (its 32
-- hex digits) and never changed; the trigger refuses updates, deletes and
-- TRUNCATE, the CHECK and the primary key a second row.

-- +goose Up
CREATE TABLE installation (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    id        TEXT    NOT NULL CHECK (length(id) = 32)
);
INSERT INTO installation (singleton, id) VALUES (1, replace(gen_random_uuid()::text, '-', ''));

-- +goose StatementBegin
CREATE FUNCTION installation_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the installation identity never changes';
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER installation_guard BEFORE UPDATE OR DELETE ON installation
    FOR EACH ROW EXECUTE FUNCTION installation_guard();
CREATE TRIGGER installation_guard_truncate BEFORE TRUNCATE ON installation
    FOR EACH STATEMENT EXECUTE FUNCTION installation_guard();

-- +goose Down
DROP TABLE installation;
DROP FUNCTION installation_guard();
