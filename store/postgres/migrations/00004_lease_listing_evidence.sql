-- The Postgres half of the SQLite migration of the same number, which
-- explains the why: the index of a tenant's lease listing and a pool
-- member's evidence.

-- +goose Up
CREATE INDEX cells_tenant_leases ON cells (tenant_id, lease_id) WHERE lease_id IS NOT NULL;
ALTER TABLE pool_members ADD COLUMN admitted_class TEXT
    CHECK (admitted_class IS NULL OR admitted_class IN ('kata_microvm', 'gvisor_lower_risk'));
ALTER TABLE pool_members ADD COLUMN agent_digest TEXT;
ALTER TABLE pool_members ADD COLUMN admitted_us BIGINT;
ALTER TABLE pool_members ADD COLUMN verified_us BIGINT;

-- +goose Down
ALTER TABLE pool_members DROP COLUMN verified_us;
ALTER TABLE pool_members DROP COLUMN admitted_us;
ALTER TABLE pool_members DROP COLUMN agent_digest;
ALTER TABLE pool_members DROP COLUMN admitted_class;
DROP INDEX cells_tenant_leases;
