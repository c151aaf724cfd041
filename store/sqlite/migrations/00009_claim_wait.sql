-- Waiting claims (CONTRACT §21): a fenced claim that carried image or
-- wait_seconds and ended empty records why, so that a replay answers the
-- same empty_reason. NULL for a lease, and for a Part I claim's empty
-- outcome, whose answer carries no reason. Like every column of a fence
-- row, it is written once, with the row.

-- +goose Up
ALTER TABLE claim_fences ADD COLUMN empty_reason TEXT;

-- +goose Down
ALTER TABLE claim_fences DROP COLUMN empty_reason;
