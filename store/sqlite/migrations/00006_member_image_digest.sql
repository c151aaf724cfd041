-- A pool member's admitted image digest (CONTRACT §15): the digest of the
-- image its provider read back as mounted or pulled, recorded at admission
-- and at every verification beside the agent's digest (migration 4).
-- NULL for a member whose pool pins no image, and for members admitted
-- before this migration.

-- +goose Up
ALTER TABLE pool_members ADD COLUMN image_digest TEXT;

-- +goose Down
ALTER TABLE pool_members DROP COLUMN image_digest;
