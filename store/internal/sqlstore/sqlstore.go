// Package sqlstore implements store.Store once, over database/sql through
// sqlx, for every SQL dialect the project ships. A Dialect supplies the few
// things that differ: placeholders, how claims on one inventory are
// serialized, and which driver errors are worth another attempt.
//
// Both schemas store times as Unix microseconds and the same column names, so
// every query below is written once with ? placeholders and rebound per
// dialect at construction.
package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/internal/ctxsleep"
)

// Dialect is what differs between SQL backends.
type Dialect struct {
	// Name names the dialect in errors ("sqlite", "postgres").
	Name string
	// Bind is the sqlx bind type of the driver's placeholders.
	Bind int
	// Lock, when set, is a statement taking one text argument, a key, that
	// holds a lock on the key until the transaction ends: it serializes
	// claims that must count a ready floor, and the refills of one pool.
	// SQLite needs none: its writers are already serialized by BEGIN
	// IMMEDIATE on one connection.
	Lock string
	// RowLock, when set, is the clause that makes a SELECT lock the rows it
	// returns ("FOR UPDATE"). Claims then pick a cell with it plus SKIP
	// LOCKED, so claims on one inventory take different cells in parallel.
	RowLock string
	// WritableCTE reports data-modifying WITH clauses: a claim's three
	// writes then go in one statement, one round trip.
	WritableCTE bool
	// Retryable reports whether a transaction failed for a transient reason
	// (serialization failure, deadlock, busy database) worth another try.
	Retryable func(error) bool
	// UniqueViolation reports whether err is a unique-constraint violation.
	UniqueViolation func(error) bool
	// Unavailable reports whether the database could not take the
	// operation for a reason outside the request (unreachable, shutting
	// down or restarting, out of space): such an error is answered 503
	// store_unavailable, which clients retry.
	Unavailable func(error) bool
	// SchemaVersion is the migration version Ping requires.
	SchemaVersion int64
	// HeldBegin, when set, makes the Store hold one connection of the
	// writer pool and run every write on it, one at a time (heldConn), for
	// a database that serializes its writers anyway; it is the statement
	// that begins a transaction there ("BEGIN IMMEDIATE"). The pool then
	// needs a second connection only for DB's users.
	// HeldBegin's error is Retryable when another connection holds the
	// write lock (SQLITE_BUSY): the held connection waits for it itself.
	HeldBegin string
}

// writer is where a Store's writes run: a connPool, whose transactions
// each take a connection, or a heldConn.
type writer interface {
	// run runs fn in a write transaction and commits it, returning fn's
	// error (a commitThen's err after the commit) or the commit's.
	run(ctx context.Context, fn func(tx txn) error) error
	// exec and row run one autocommitted statement.
	exec(ctx context.Context, q string, args ...any) (sql.Result, error)
	row(ctx context.Context, q string, args ...any) scanner
	close() error
}

// txConn is what a write transaction's statements run on: a pool's
// transaction (poolTx) or the held connection (heldTx). Its writer ends it.
type txConn interface {
	// stmt returns q's prepared statement for the transaction, and the
	// context to run it under.
	stmt(ctx context.Context, q string) (*sqlx.Stmt, context.Context, error)
	// query runs a query built at run time.
	query(ctx context.Context, q string, args ...any) scanner
}

// txn is a write transaction. Its exec, row and rows run one of the
// store's fixed queries, prepared.
type txn struct{ txConn }

func (t txn) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	st, ctx, err := t.stmt(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

func (t txn) row(ctx context.Context, q string, args ...any) scanner {
	st, ctx, err := t.stmt(ctx, q)
	if err != nil {
		return errScanner{err}
	}
	return st.QueryRowxContext(ctx, args...)
}

func (t txn) rows(ctx context.Context, q string, args ...any) (*sqlx.Rows, error) {
	st, ctx, err := t.stmt(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.QueryxContext(ctx, args...)
}

// Store implements store.Store over a writer pool and a reader pool, which
// may be the same *sqlx.DB.
type Store struct {
	w   writer    // every write
	r   *connPool // reads that need no transaction
	wdb *sql.DB   // the writer pool, for DB
	d   Dialect
	q   queries
	// claiming counts the claims in flight; one alone may take claimAlone.
	claiming atomic.Int32
	// hints maps an inventory to its next candidates, oldest first, as a
	// committed lease statement (claimAlone) or pick (serialized writers)
	// last saw them: where the next claim on it starts.
	hintsMu sync.Mutex
	hints   map[string][]candidate
}

// New returns a Store. w runs every transaction that writes; r serves reads
// that need no transaction.
func New(w, r *sqlx.DB, d Dialect) *Store {
	q := bindQueries(w, d)
	fixed := append(q.fixed(), d.Lock)
	s := &Store{r: newConnPool(r, fixed), wdb: w.DB, d: d, q: q, hints: map[string][]candidate{}}
	switch {
	case d.HeldBegin != "":
		s.w = newHeldConn(w, d.HeldBegin, d.Retryable, fixed)
	case r == w:
		s.w = s.r
	default:
		s.w = newConnPool(w, fixed)
	}
	return s
}

// DB returns the pool every write transaction runs on, with the store's
// connection settings. It is for tooling and benchmarks (a baseline
// transaction on the same settings); never write the store's tables
// through it.
func (s *Store) DB() *sql.DB { return s.wdb }

// Close closes both pools.
func (s *Store) Close() error {
	err := s.w.close()
	if s.r != s.w {
		err = errors.Join(err, s.r.close())
	}
	return err
}

// Ping reports whether the database answers and is migrated to the version
// this build expects.
func (s *Store) Ping(ctx context.Context) error {
	var v sql.NullInt64
	if err := s.r.db.GetContext(ctx, &v, s.q.schemaVersion); err != nil {
		return fmt.Errorf("%s: schema version: %w", s.d.Name, err)
	}
	if v.Int64 != s.d.SchemaVersion {
		return fmt.Errorf("%s: schema at version %d, this build needs %d (run `sandboxwich migrate`)",
			s.d.Name, v.Int64, s.d.SchemaVersion)
	}
	return nil
}

// Installation returns the installation identity migration 3 recorded:
// 32 lowercase hex digits, the same for the life of the database.
func (s *Store) Installation(ctx context.Context) (string, error) {
	var id string
	if err := s.r.db.GetContext(ctx, &id, s.q.installation); err != nil {
		return "", s.fail(ctx, "installation", fmt.Errorf("%w (is the database migrated? run `sandboxwich migrate`)", err))
	}
	return id, nil
}

// commitThen makes a transaction commit and its caller still receive err:
// for outcomes that change state and are reported as conflicts (a lease
// found expired is quarantined, and the caller is told so).
type commitThen struct{ err error }

func (c commitThen) Error() string { return c.err.Error() }

// errRetry asks for a new attempt: a compare-and-set found the row changed.
var errRetry = errors.New("compare-and-set lost; retry")

const maxAttempts = 8

// inTx runs fn in one write transaction, retrying it from scratch on
// transient failures and on errRetry. It returns errRetry when every attempt
// lost.
func (s *Store) inTx(ctx context.Context, fn func(tx txn) error) error {
	var err error
	for attempt := 0; attempt < maxAttempts; attempt++ {
		if attempt > 0 {
			if werr := backoff(ctx, attempt); werr != nil {
				return werr
			}
		}
		err = s.once(ctx, fn)
		if err == nil {
			return nil
		}
		if !errors.Is(err, errRetry) && !s.d.Retryable(err) {
			return err
		}
	}
	if s.d.Retryable(err) {
		return fmt.Errorf("%w: %w", errRetry, err)
	}
	return err
}

// lock takes the dialect's transaction-scoped lock on key, if it has one.
func (s *Store) lock(ctx context.Context, tx txn, key string) error {
	if s.d.Lock == "" {
		return nil
	}
	_, err := tx.exec(ctx, s.d.Lock, key)
	return err
}

func (s *Store) once(ctx context.Context, fn func(tx txn) error) error { return s.w.run(ctx, fn) }

// run implements writer for a pool: fn in a transaction of its own,
// committed unless fn failed (a commitThen commits and still returns its
// err).
func (p *connPool) run(ctx context.Context, fn func(tx txn) error) error {
	tx, err := p.beginTx(ctx)
	if err != nil {
		return err
	}
	defer func() {
		// A panic must not leave the transaction open.
		if p := recover(); p != nil {
			tx.rollback()
			panic(p)
		}
	}()
	err = fn(txn{tx})
	if ct, ok := err.(commitThen); ok {
		if cerr := tx.commit(ctx); cerr != nil {
			return cerr
		}
		return ct.err
	}
	if err != nil {
		tx.rollback()
		return err
	}
	return tx.commit(ctx)
}

func backoff(ctx context.Context, attempt int) error {
	return ctxsleep.Sleep(ctx, time.Duration(attempt*attempt)*200*time.Microsecond)
}

// fail maps an unexpected database error to an internal error that keeps
// its cause for logs, or to store_unavailable when the dialect says the
// database could not take it; wire errors pass through unchanged. An
// operation whose context ended fails with the context's error, however
// the driver reported it (Postgres: "canceling statement due to user
// request").
func (s *Store) fail(ctx context.Context, op string, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := errors.AsType[*errcode.Error](err); ok {
		return err
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%s %s: %w (%v)", s.d.Name, op, cerr, err)
	}
	cause := fmt.Errorf("%s %s: %w", s.d.Name, op, err)
	if s.d.Unavailable != nil && s.d.Unavailable(err) {
		return errcode.Wrap(errcode.StoreUnavailable, "the database is unavailable; retry later", cause)
	}
	return errcode.Wrap(errcode.Internal, "storage failure", cause)
}

func affected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

func us(t time.Time) int64 { return t.UnixMicro() }

func fromUS(v int64) time.Time { return time.UnixMicro(v).UTC() }

func secondsDuration(n uint64) time.Duration { return time.Duration(n) * time.Second }
