-- The installation: one row naming this plane's database, created here
-- from 16 random bytes and never changed. Drivers put a short hash of it
-- into every provider object they create (container IDs, labels), so that
-- two planes sharing a host, a runsc state root or a namespace never take
-- each other's objects for orphans. The triggers refuse any change; the
-- CHECK and the primary key refuse a second row.

-- +goose Up
CREATE TABLE installation (
    singleton INTEGER PRIMARY KEY CHECK (singleton = 1),
    id        TEXT    NOT NULL CHECK (length(id) = 32)
);
INSERT INTO installation (singleton, id) VALUES (1, lower(hex(randomblob(16))));

-- +goose StatementBegin
CREATE TRIGGER installation_no_update BEFORE UPDATE ON installation
BEGIN
    SELECT RAISE(ABORT, 'the installation identity never changes');
END;
-- +goose StatementEnd

-- +goose StatementBegin
CREATE TRIGGER installation_no_delete BEFORE DELETE ON installation
BEGIN
    SELECT RAISE(ABORT, 'the installation identity never changes');
END;
-- +goose StatementEnd

-- +goose Down
DROP TABLE installation;
