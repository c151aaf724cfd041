-- The Postgres half of the SQLite migration of the same purpose (11
-- there), which explains the column: a cell's egress policy (CONTRACT §22).

-- +goose Up
ALTER TABLE cells ADD COLUMN egress TEXT NOT NULL DEFAULT 'none';

-- +goose Down
ALTER TABLE cells DROP COLUMN egress;
