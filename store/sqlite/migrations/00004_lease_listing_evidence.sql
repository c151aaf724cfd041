-- Lease listing and a pool member's evidence (CONTRACT §14, §15).
--   * cells_tenant_leases serves a tenant's listing, newest lease first
--     (lease IDs are UUIDv7), as a keyset scan: one index entry per lease,
--     none for a cell never leased.
--   * A member records what was read back from its provider (and agent)
--     when it was admitted and at its last verification: the admitted
--     runtime class, the agent's build digest, and when. NULL for members
--     admitted before this migration. pool_members has no guard trigger:
--     these columns change at every verification.

-- +goose Up
CREATE INDEX cells_tenant_leases ON cells (tenant_id, lease_id) WHERE lease_id IS NOT NULL;
ALTER TABLE pool_members ADD COLUMN admitted_class TEXT
    CHECK (admitted_class IS NULL OR admitted_class IN ('kata_microvm', 'gvisor_lower_risk'));
ALTER TABLE pool_members ADD COLUMN agent_digest TEXT;
ALTER TABLE pool_members ADD COLUMN admitted_us INTEGER;
ALTER TABLE pool_members ADD COLUMN verified_us INTEGER;

-- +goose Down
ALTER TABLE pool_members DROP COLUMN verified_us;
ALTER TABLE pool_members DROP COLUMN admitted_us;
ALTER TABLE pool_members DROP COLUMN agent_digest;
ALTER TABLE pool_members DROP COLUMN admitted_class;
DROP INDEX cells_tenant_leases;
