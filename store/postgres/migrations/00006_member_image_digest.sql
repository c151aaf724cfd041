-- The Postgres half of the SQLite migration of the same number, which
-- explains the why: a pool member's admitted image digest.

-- +goose Up
ALTER TABLE pool_members ADD COLUMN image_digest TEXT;

-- +goose Down
ALTER TABLE pool_members DROP COLUMN image_digest;
