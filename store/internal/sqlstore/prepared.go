package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"

	"github.com/jmoiron/sqlx"
)

// connPool is a connection pool whose fixed queries are prepared statements:
// database/sql keeps each *sql.Stmt's handle per connection, so a query is
// parsed once per connection and, on Postgres, runs in one round trip
// (Bind/Execute) instead of two (Parse/Describe, then Bind/Execute).
//
// Every fixed query is prepared together, on first use and never inside a
// transaction: preparing takes a connection of its own, and the writer
// pool may have only the one a transaction holds. Queries built at run time
// (a variable IN list) are not prepared.
type connPool struct {
	db      *sqlx.DB
	queries []string

	mu    sync.Mutex
	ready atomic.Bool
	stmts stmtSet // complete before ready is set; read-only after
}

func newConnPool(db *sqlx.DB, queries []string) *connPool { return &connPool{db: db, queries: queries} }

// prepare prepares every fixed query once. It fails, to be tried again on
// the next use, while the database is unreachable or not yet migrated.
func (p *connPool) prepare(ctx context.Context) error {
	if p.ready.Load() {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ready.Load() {
		return nil
	}
	stmts, err := prepareAll(ctx, p.db, p.queries)
	if err != nil {
		return err
	}
	p.stmts = stmts
	p.ready.Store(true)
	return nil
}

// stmt returns q's prepared statement.
func (p *connPool) stmt(ctx context.Context, q string) (*sqlx.Stmt, error) {
	if err := p.prepare(ctx); err != nil {
		return nil, err
	}
	return p.stmts.get(q)
}

func (p *connPool) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	st, err := p.stmt(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (p *connPool) row(ctx context.Context, q string, args ...any) scanner {
	st, err := p.stmt(ctx, q)
	if err != nil {
		return errScanner{err}
	}
	return st.QueryRowxContext(ctx, args...)
}

// all scans every row of q into dest, a pointer to a slice of structs
// whose fields name q's columns (sqlx.Select).
func (p *connPool) all(ctx context.Context, dest any, q string, args ...any) error {
	st, err := p.stmt(ctx, q)
	if err != nil {
		return err
	}
	return st.SelectContext(ctx, dest, args...)
}

// close closes the prepared statements, then the pool.
func (p *connPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return errors.Join(p.stmts.close(), p.db.Close())
}

// beginTx begins a database/sql transaction, which runs the pool's
// prepared statements on its connection.
func (p *connPool) beginTx(ctx context.Context) (poolTx, error) {
	if err := p.prepare(ctx); err != nil {
		return poolTx{}, err
	}
	tx, err := p.db.BeginTxx(ctx, nil)
	if err != nil {
		return poolTx{}, err
	}
	return poolTx{tx, p}, nil
}

// poolTx is a transaction of a connPool. Its pool was prepared before the
// transaction began.
type poolTx struct {
	tx *sqlx.Tx
	p  *connPool
}

// stmt returns q's prepared statement, bound to the transaction, which
// watches ctx itself.
func (t poolTx) stmt(ctx context.Context, q string) (*sqlx.Stmt, context.Context, error) {
	st, err := t.p.stmts.get(q)
	if err != nil {
		return nil, nil, err
	}
	return t.tx.StmtxContext(ctx, st), ctx, nil
}

func (t poolTx) query(ctx context.Context, q string, args ...any) scanner {
	return t.tx.QueryRowxContext(ctx, q, args...)
}

func (t poolTx) commit(context.Context) error { return t.tx.Commit() }

func (t poolTx) rollback() { _ = t.tx.Rollback() }

// stmtSet is a pool's prepared statements, by query.
type stmtSet map[string]*sqlx.Stmt

// prepareAll prepares every query on db, a pool or a connection, or none.
func prepareAll(ctx context.Context, db interface {
	PreparexContext(context.Context, string) (*sqlx.Stmt, error)
}, queries []string) (stmtSet, error) {
	m := make(stmtSet, len(queries))
	for _, q := range queries {
		if _, ok := m[q]; ok || q == "" {
			continue
		}
		st, err := db.PreparexContext(ctx, q)
		if err != nil {
			_ = m.close()
			return nil, err
		}
		m[q] = st
	}
	return m, nil
}

// close closes every statement.
func (m stmtSet) close() error {
	var errs []error
	for _, st := range m {
		errs = append(errs, st.Close())
	}
	return errors.Join(errs...)
}

// get returns q's statement, or errNotPrepared.
func (m stmtSet) get(q string) (*sqlx.Stmt, error) {
	if st := m[q]; st != nil {
		return st, nil
	}
	return nil, errNotPrepared
}

// errNotPrepared is a programming error: a fixed query missing from the
// list New prepares.
var errNotPrepared = errors.New("sqlstore: query is not among the prepared statements")

// errScanner is a row whose statement could not be prepared.
type errScanner struct{ err error }

func (e errScanner) Scan(...any) error { return e.err }
