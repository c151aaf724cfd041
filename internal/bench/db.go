package bench

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/internal/seed"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/postgres"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// backend is one database under test with a plane over it.
type backend struct {
	name   string
	bind   int
	st     store.Store
	db     *sql.DB // the store's writer pool: the baseline runs on it
	update *sql.Stmt
	// floor, on SQLite, is the baseline's transaction on a held
	// connection (holdFloor); nil elsewhere.
	floor   func(ctx context.Context, i int) error
	plane   *sandboxwich.Plane
	keys    *attest.Keyring
	rel     lease.Release
	cleanup func()
}

var benchBinding = lease.Binding{OrganizationID: "org-bench", WorkspaceID: "ws-bench", ThreadID: "thread-bench", RunnerSessionID: "run-bench"}

const benchTenant = "bench"

// dbStore is what both stores provide beyond store.Store.
type dbStore interface {
	store.Store
	DB() *sql.DB
}

func openSQLite(ctx context.Context, dir string) (*backend, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, "bench.db"), sqlite.Options{})
	if err != nil {
		return nil, err
	}
	b, err := newBackend("sqlite", sqlx.QUESTION, st, func() {})
	if err != nil {
		return nil, err
	}
	if err := b.holdFloor(ctx); err != nil {
		b.cleanup()
		return nil, err
	}
	return b, nil
}

// holdFloor sets b.floor: the baseline's transaction on a connection of
// the store's writer pool held for it, with BEGIN IMMEDIATE, the update
// and COMMIT prepared there and no statement under a context the driver
// would watch — the way the SQLite store runs its own transactions (whose
// BEGIN waits for another connection's lock itself: nothing else writes
// while the floor runs). The pool grows by the one connection (the store
// holds one, the plain baseline uses another).
func (b *backend) holdFloor(ctx context.Context) error {
	b.db.SetMaxOpenConns(3)
	conn, err := b.db.Conn(ctx)
	if err != nil {
		return err
	}
	var stmts [3]*sql.Stmt
	for i, q := range []string{"BEGIN IMMEDIATE", "UPDATE bench_baseline SET n = n + 1 WHERE id = ? RETURNING n", "COMMIT"} {
		if stmts[i], err = conn.PrepareContext(ctx, q); err != nil {
			conn.Close()
			return fmt.Errorf("sqlite: held baseline: %w", err)
		}
	}
	begin, update, commit := stmts[0], stmts[1], stmts[2]
	b.floor = func(ctx context.Context, _ int) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		quiet := context.WithoutCancel(ctx)
		if _, err := begin.ExecContext(quiet); err != nil {
			return err
		}
		var n int64
		if err := update.QueryRowContext(quiet, 1).Scan(&n); err != nil {
			_, _ = conn.ExecContext(quiet, "ROLLBACK")
			return err
		}
		_, err := commit.ExecContext(quiet)
		return err
	}
	cleanup := b.cleanup
	b.cleanup = func() { conn.Close(); cleanup() }
	return nil
}

func openPostgres(ctx context.Context, base string) (*backend, error) {
	var r [6]byte
	_, _ = rand.Read(r[:])
	schema := "sbw_bench_" + hex.EncodeToString(r[:])
	admin, err := sql.Open("postgres", base)
	if err != nil {
		return nil, err
	}
	if _, err := admin.ExecContext(ctx, `CREATE SCHEMA `+schema); err != nil {
		admin.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	drop := func() {
		_, _ = admin.Exec(`DROP SCHEMA ` + schema + ` CASCADE`)
		admin.Close()
	}
	u, err := url.Parse(base)
	if err != nil {
		drop()
		return nil, err
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	st, err := postgres.Open(ctx, u.String(), postgres.Options{MaxConns: 40})
	if err != nil {
		drop()
		return nil, err
	}
	return newBackend("postgres", sqlx.DOLLAR, st, drop)
}

func newBackend(name string, bind int, st dbStore, cleanup func()) (*backend, error) {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	keys, _ := attest.NewKeyring(key)
	rel := lease.Release{ReleaseSetID: "bench", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: strings.Repeat("b", 64)}
	rel.Signature = keys.SignRelease(rel)
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		return nil, err
	}
	b := &backend{name: name, bind: bind, st: st, db: st.DB(), plane: plane, keys: keys, rel: rel}
	b.cleanup = func() { st.Close(); cleanup() }
	_, err = b.db.Exec(`CREATE TABLE bench_baseline (id INTEGER PRIMARY KEY, n BIGINT NOT NULL)`)
	if err == nil {
		_, err = b.db.Exec(`INSERT INTO bench_baseline (id, n) VALUES (1, 0)`)
	}
	if err == nil {
		b.update, err = b.db.Prepare(sqlx.Rebind(bind, `UPDATE bench_baseline SET n = n + 1 WHERE id = ? RETURNING n`))
	}
	if err != nil {
		b.cleanup()
		return nil, fmt.Errorf("%s: baseline table: %w", name, err)
	}
	return b, nil
}

// baseline is the database's own floor for a serialized read-modify-write:
// one transaction updating one row and returning it, on the store's own
// pool and settings, with a prepared statement as the store's are. Every
// worker updates the same row: the baseline serializes where claims of one
// inventory need not.
func (b *backend) baseline(ctx context.Context, _ int) error {
	tx, err := b.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	var n int64
	if err := tx.StmtContext(ctx, b.update).QueryRowContext(ctx, 1).Scan(&n); err != nil {
		_ = tx.Rollback()
		return err
	}
	return tx.Commit()
}

// claim makes one fenced claim and fails when no cell was leased.
func (b *backend) claim(ctx context.Context, _ int) error {
	res, err := b.plane.Claim(ctx, benchTenant, sandboxwich.ClaimRequest{ClaimID: uuid.Must(uuid.NewV7()), Release: b.rel, Binding: benchBinding})
	if err == nil && res.Lease == nil {
		err = fmt.Errorf("%s: claim found no ready cell", b.name)
	}
	return err
}

// seed inserts ready cells (and as many terminal ones when terminal) in
// the shape Prepare writes, in one transaction (package seed).
func (b *backend) seed(ctx context.Context, ready, terminal int) error {
	if err := seed.Write(ctx, b.db, b.bind, seed.Cells{TenantID: benchTenant, WorkerID: "bench-worker", Release: b.rel,
		Ready: ready, Terminal: terminal, Now: time.Now()}); err != nil {
		return err
	}
	// Fresh planner statistics, as a long-running database would have.
	_, err := b.db.ExecContext(ctx, `ANALYZE`)
	return err
}

func tempDir() (string, func(), error) {
	dir, err := os.MkdirTemp("", "sandboxwich-bench-")
	return dir, func() { os.RemoveAll(dir) }, err
}
