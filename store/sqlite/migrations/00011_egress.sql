-- Egress policy (CONTRACT §22).
--   * cells.egress is the cell's effective egress policy in its canonical
--     form ('none', or host:port lines): its pool's, written when the row
--     is inserted, narrowed by a claim that names egress when the cell is
--     leased. Evidence reports it, and egress_digest is its SHA-256.
--     A cell prepared by an external worker has none.

-- +goose Up
ALTER TABLE cells ADD COLUMN egress TEXT NOT NULL DEFAULT 'none';

-- +goose Down
ALTER TABLE cells DROP COLUMN egress;
