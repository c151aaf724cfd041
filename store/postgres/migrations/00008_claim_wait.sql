-- The Postgres half of the SQLite migration of the same purpose (9 there):
-- a fenced claim's empty outcome records its empty_reason (CONTRACT §21).

-- +goose Up
ALTER TABLE claim_fences ADD COLUMN empty_reason TEXT;

-- +goose Down
ALTER TABLE claim_fences DROP COLUMN empty_reason;
