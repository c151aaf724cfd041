-- A lease_id is unique within its tenant, through the index that lists a
-- tenant's leases (migration 4), made unique, instead of through an index
-- of its own (migration 2's cells_lease): a claim's commit writes one
-- B-tree fewer, about 1.2 WAL frames of 9 (docs/performance.md, wave 16).
-- Every lookup of a lease names its tenant (CONTRACT: a lease_id is found
-- within the caller's tenant), and the plane mints lease IDs as UUIDv7.
-- Postgres keeps its global unique constraint: its claim fences' foreign
-- key refers to it.

-- +goose Up
DROP INDEX cells_tenant_leases;
DROP INDEX cells_lease;
CREATE UNIQUE INDEX cells_tenant_leases ON cells (tenant_id, lease_id) WHERE lease_id IS NOT NULL;

-- +goose Down
DROP INDEX cells_tenant_leases;
CREATE UNIQUE INDEX cells_lease ON cells (lease_id) WHERE lease_id IS NOT NULL;
CREATE INDEX cells_tenant_leases ON cells (tenant_id, lease_id) WHERE lease_id IS NOT NULL;
