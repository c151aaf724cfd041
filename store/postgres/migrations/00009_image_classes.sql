-- The Postgres half of the SQLite migration of the same purpose (10
-- there), which explains the columns: a member's image, a cell's image and
-- whether it belongs to an image class (CONTRACT §21).

-- +goose Up
ALTER TABLE pool_members ADD COLUMN image TEXT;
ALTER TABLE cells ADD COLUMN image TEXT;
ALTER TABLE cells ADD COLUMN image_class INTEGER NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE cells DROP COLUMN image_class;
ALTER TABLE cells DROP COLUMN image;
ALTER TABLE pool_members DROP COLUMN image;
