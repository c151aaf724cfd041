package sqlstore

import (
	"context"
	"database/sql"
	"fmt"
	"io/fs"

	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

// Migrate applies every embedded migration of fsys that db lacks, in order,
// each in its own transaction. locker, when set, serializes concurrent
// migrators (several replicas starting at once on one Postgres).
func Migrate(ctx context.Context, db *sql.DB, dialect goose.Dialect, fsys fs.FS, locker lock.SessionLocker) error {
	opts := []goose.ProviderOption{}
	if locker != nil {
		opts = append(opts, goose.WithSessionLocker(locker))
	}
	p, err := goose.NewProvider(dialect, db, fsys, opts...)
	if err != nil {
		return fmt.Errorf("migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("migrate %s: %w", dialect, err)
	}
	return nil
}

// LatestVersion returns the highest migration version in fsys: the schema
// version this build needs. It reads nothing from db.
func LatestVersion(dialect goose.Dialect, db *sql.DB, fsys fs.FS) (int64, error) {
	p, err := goose.NewProvider(dialect, db, fsys)
	if err != nil {
		return 0, fmt.Errorf("migrations: %w", err)
	}
	srcs := p.ListSources()
	if len(srcs) == 0 {
		return 0, fmt.Errorf("migrations: none embedded")
	}
	return srcs[len(srcs)-1].Version, nil
}
