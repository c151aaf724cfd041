package sqlstore

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/jmoiron/sqlx"
)

// heldConn is the writer of a dialect whose database serializes writers
// anyway (SQLite): one connection of the writer pool, held for the store's
// life, on which every write runs, one caller at a time.
//
// It runs transactions with its own prepared BEGIN, COMMIT and ROLLBACK
// instead of database/sql's Tx, which takes a connection from the pool,
// starts a goroutine to watch the transaction's context, and has the
// driver prepare BEGIN and COMMIT anew each time. Inside a transaction,
// which already holds the database's write lock, statements run without
// their context's cancellation, once it has been checked: the driver would
// otherwise start a goroutine per statement to watch it. Together that is
// about 15 µs of a 270 µs claim (docs/performance.md). What may wait on
// another connection's write lock — BEGIN and an autocommitted write —
// still runs under the caller's context.
type heldConn struct {
	db      *sqlx.DB
	begin   string
	queries []string
	// turn holds a token while a caller uses the connection: a one-slot
	// semaphore that, unlike a mutex, gives up when its waiter's context
	// ends.
	turn chan struct{}
	// Taken with the turn:
	conn  *sqlx.Conn // nil until first use, and after a failure left it in doubt
	stmts stmtSet    // prepared on conn
}

// The statements that end a held transaction.
const (
	commitSQL   = "COMMIT"
	rollbackSQL = "ROLLBACK"
)

func newHeldConn(db *sqlx.DB, begin string, queries []string) *heldConn {
	return &heldConn{db: db, begin: begin, queries: append(queries, begin, commitSQL, rollbackSQL), turn: make(chan struct{}, 1)}
}

// take waits for the turn and makes sure the connection is open, with
// every fixed query prepared on it. Whoever takes it must release it.
func (h *heldConn) take(ctx context.Context) error {
	select {
	case h.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	if h.conn != nil {
		return nil
	}
	if err := h.open(ctx); err != nil {
		h.release()
		return err
	}
	return nil
}

func (h *heldConn) release() { <-h.turn }

// open takes a connection from the pool and prepares every fixed query on
// it. It fails, to be tried again on the next use, while the database is
// unreachable or not yet migrated.
func (h *heldConn) open(ctx context.Context) error {
	conn, err := h.db.Connx(ctx)
	if err != nil {
		return err
	}
	stmts, err := prepareAll(ctx, conn, h.queries)
	if err != nil {
		_ = conn.Close()
		return err
	}
	h.conn, h.stmts = conn, stmts
	return nil
}

// drop closes the statements and discards the connection, whose state is
// in doubt (a transaction that would not end), so that the next use opens
// a fresh one.
func (h *heldConn) drop() {
	_ = h.stmts.close()
	// Returning driver.ErrBadConn from Raw makes database/sql close the
	// connection rather than return it to the pool.
	_ = h.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = h.conn.Close()
	h.conn, h.stmts = nil, nil
}

// beginTx implements writer: BEGIN, under ctx, as it may wait for another
// connection's write lock.
func (h *heldConn) beginTx(ctx context.Context) (txn, error) {
	if err := h.take(ctx); err != nil {
		return txn{}, err
	}
	if _, err := h.stmts[h.begin].ExecContext(ctx); err != nil {
		h.settle()
		return txn{}, err
	}
	return txn{heldTx{h}}, nil
}

// settle ends a turn whose transaction may be open: it rolls back, and
// if even that fails — no transaction was open after all, or the
// connection is in doubt — drops the connection; then it releases the
// turn. A BEGIN that failed may have begun: the driver reports a statement
// whose context ended while it ran as failed, whether or not it took
// effect.
func (h *heldConn) settle() {
	if _, err := h.stmts[rollbackSQL].ExecContext(context.Background()); err != nil {
		h.drop()
	}
	h.release()
}

// exec implements writer: an autocommitted write, under ctx.
func (h *heldConn) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if err := h.take(ctx); err != nil {
		return nil, err
	}
	defer h.release()
	st, err := h.stmts.get(q)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// row implements writer: an autocommitted statement returning a row,
// under ctx. The turn is held until the row is scanned.
func (h *heldConn) row(ctx context.Context, q string, args ...any) scanner {
	if err := h.take(ctx); err != nil {
		return errScanner{err}
	}
	st, err := h.stmts.get(q)
	if err != nil {
		h.release()
		return errScanner{err}
	}
	return releasingRow{st.QueryRowxContext(ctx, args...), h.release}
}

// releasingRow is a row that releases the writer's turn once scanned.
type releasingRow struct {
	row     *sqlx.Row
	release func()
}

func (r releasingRow) Scan(dest ...any) error {
	defer r.release()
	return r.row.Scan(dest...)
}

// close waits for the turn, then closes the statements, the connection
// and the pool. Like sql.DB's, it may be called again; later uses fail as
// the pool is closed.
func (h *heldConn) close() error {
	h.turn <- struct{}{}
	defer h.release()
	var err error
	if h.conn != nil {
		err = errors.Join(h.stmts.close(), h.conn.Close())
		h.conn, h.stmts = nil, nil
	}
	return errors.Join(err, h.db.Close())
}

// heldTx is a transaction on the held connection, which holds the turn
// until it commits or rolls back.
type heldTx struct{ h *heldConn }

// quiet checks ctx, then returns it without its cancellation: the
// transaction holds the write lock, its statements are short, and a
// context the driver need not watch saves a goroutine per statement.
func quiet(ctx context.Context) (context.Context, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return context.WithoutCancel(ctx), nil
}

// stmt returns q's statement, prepared on the connection, and ctx without
// its cancellation (quiet).
func (t heldTx) stmt(ctx context.Context, q string) (*sqlx.Stmt, context.Context, error) {
	st, err := t.h.stmts.get(q)
	if err != nil {
		return nil, nil, err
	}
	ctx, err = quiet(ctx)
	return st, ctx, err
}

func (t heldTx) query(ctx context.Context, q string, args ...any) scanner {
	ctx, err := quiet(ctx)
	if err != nil {
		return errScanner{err}
	}
	return t.h.conn.QueryRowxContext(ctx, q, args...)
}

// commit commits unless ctx has ended, in which case it rolls back and
// returns ctx's error: a transaction whose caller has gone changes nothing.
func (t heldTx) commit(ctx context.Context) error {
	ctx, err := quiet(ctx)
	if err == nil {
		_, err = t.h.stmts[commitSQL].ExecContext(ctx)
	}
	if err != nil {
		t.h.settle()
		return err
	}
	t.h.release()
	return nil
}

func (t heldTx) rollback() { t.h.settle() }
