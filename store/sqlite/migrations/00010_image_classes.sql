-- Image classes (CONTRACT §21): cells made per image, on demand.
--   * pool_members.image is the image, pinned by digest, an image class's
--     member is made of: chosen when the member is created (the intent),
--     so that a provision resumed after a crash makes the same image.
--     NULL for a fixed pool's members, whose image is the pool's.
--   * cells.image is the image a pool cell runs (its pool's, or its
--     member's), and cells.image_class marks the cells of image classes:
--     a claim that names an image takes only cells of that image; one that
--     names none (Part I) never takes an image class's cell.
-- All three are written once, when the row is inserted.

-- +goose Up
ALTER TABLE pool_members ADD COLUMN image TEXT;
ALTER TABLE cells ADD COLUMN image TEXT;
ALTER TABLE cells ADD COLUMN image_class INTEGER NOT NULL DEFAULT 0;

-- +goose Down
ALTER TABLE cells DROP COLUMN image_class;
ALTER TABLE cells DROP COLUMN image;
ALTER TABLE pool_members DROP COLUMN image;
