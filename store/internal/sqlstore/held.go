package sqlstore

import (
	"cmp"
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
)

// heldConn is the writer of a dialect whose database serializes writers
// anyway (SQLite): one connection of the writer pool, held for the store's
// life, on which every write runs, one caller at a time.
//
// It runs transactions with its own prepared BEGIN, COMMIT and ROLLBACK
// instead of database/sql's Tx, which takes a connection from the pool,
// starts a goroutine to watch the transaction's context, and has the
// driver prepare BEGIN and COMMIT anew each time. No statement runs under a
// context that can end, once it has been checked: the driver would start a
// goroutine per statement to watch it (docs/performance.md). Inside a
// transaction, which holds the database's write lock, statements are
// short. Only BEGIN may wait, for another connection's write lock, and
// that wait is the held connection's own: the driver's is turned off
// (noBusyWait), and beginGroup tries again while any caller of its group
// still waits.
//
// Every write runs through run, an autocommitted one (exec, row) as a
// transaction of its own. Transactions are committed in groups: whoever
// takes the turn runs every transaction that queued meanwhile (up to
// maxGroup), each in a savepoint of one transaction, and commits them with
// one COMMIT — one fsync for the group — before any of them is answered.
// See run.
type heldConn struct {
	db      *sqlx.DB
	begin   string
	busy    func(error) bool // BEGIN found the write lock taken (Dialect.Retryable)
	queries []string
	// turn holds a token while a caller uses the connection: a one-slot
	// semaphore that, unlike a mutex, gives up when its waiter's context
	// ends.
	turn chan struct{}
	// Taken with the turn:
	conn  *sqlx.Conn // nil until first use, and after a failure left it in doubt
	stmts stmtSet    // prepared on conn

	mu    sync.Mutex
	queue []*member // transactions waiting for a group, oldest first
}

// The statements that end a held transaction, and those of a group's
// members.
const (
	commitSQL     = "COMMIT"
	rollbackSQL   = "ROLLBACK"
	savepointSQL  = "SAVEPOINT member"
	releaseSQL    = "RELEASE member"
	rollbackToSQL = "ROLLBACK TO member"
)

// maxGroup bounds the transactions one commit carries.
const maxGroup = 64

// noBusyWait turns the driver's own wait for a lock off on the held
// connection (SQLite's busy_timeout): beginGroup waits instead.
const noBusyWait = "PRAGMA busy_timeout = 0"

// lockTimeout bounds beginGroup's wait for another connection's write lock, as
// busy_timeout (10 s) bounds the wait of the pool's other connections.
const lockTimeout = 10 * time.Second

// lockDelays are the pauses between beginGroup's attempts, SQLite's own
// busy handler's: the last repeats.
var lockDelays = [...]time.Duration{1, 2, 5, 10, 15, 20, 25, 25, 25, 50, 50, 100}

// newHeldConn returns the held writer of db; begin starts a transaction
// that takes the write lock, and busy reports its error when another
// connection holds it (or another transient one worth waiting out).
func newHeldConn(db *sqlx.DB, begin string, busy func(error) bool, queries []string) *heldConn {
	return &heldConn{db: db, begin: begin, busy: busy, turn: make(chan struct{}, 1),
		queries: append(queries, begin, commitSQL, rollbackSQL, savepointSQL, releaseSQL, rollbackToSQL)}
}

// release gives back the turn, which its caller took.
func (h *heldConn) release() { <-h.turn }

// open takes a connection from the pool and prepares every fixed query on
// it. It fails, to be tried again on the next use, while the database is
// unreachable or not yet migrated.
func (h *heldConn) open(ctx context.Context) error {
	conn, err := h.db.Connx(ctx)
	if err != nil {
		return err
	}
	if _, err := conn.ExecContext(ctx, noBusyWait); err != nil {
		_ = conn.Close() // returned to the pool unchanged
		return err
	}
	stmts, err := prepareAll(ctx, conn, h.queries)
	if err != nil {
		discard(conn) // the pool's connections wait for locks themselves
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
	discard(h.conn)
	h.conn, h.stmts = nil, nil
}

// discard closes conn instead of returning it to the pool.
func discard(conn *sqlx.Conn) {
	// Returning driver.ErrBadConn from Raw makes database/sql close the
	// connection rather than return it to the pool.
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = conn.Close()
}

// abort rolls back a transaction that may be open, or drops the
// connection if even that fails; the caller holds the turn.
func (h *heldConn) abort() {
	if _, err := h.stmts[rollbackSQL].ExecContext(context.Background()); err != nil {
		h.drop()
	}
}

// exec implements writer: an autocommitted write, run as a transaction of
// its own (run).
func (h *heldConn) exec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	var res sql.Result
	err := h.run(ctx, func(tx txn) error {
		var err error
		res, err = tx.exec(ctx, q, args...)
		return err
	})
	return res, err
}

// row implements writer: an autocommitted statement returning a row, run
// as exec's when it is scanned.
func (h *heldConn) row(ctx context.Context, q string, args ...any) scanner {
	return heldRow{h: h, ctx: ctx, q: q, args: args}
}

// heldRow is row's statement, waiting for its Scan.
type heldRow struct {
	h    *heldConn
	ctx  context.Context
	q    string
	args []any
}

func (r heldRow) Scan(dest ...any) error {
	return r.h.run(r.ctx, func(tx txn) error { return tx.row(r.ctx, r.q, r.args...).Scan(dest...) })
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

// heldTx is where a group's transactions run their statements: the held
// connection, whose turn the group's leader holds (run).
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

// member is a transaction queued for a group commit, and where its
// outcome goes.
type member struct {
	ctx  context.Context
	fn   func(txn) error
	done chan outcome // buffered: the leader never waits on it
}

// outcome is a member's result: fn's error (a commitThen's after the
// commit), the commit's, or the value fn panicked with.
type outcome struct {
	err      error
	panicked bool
	value    any
}

// run implements writer: fn in a write transaction, committed with the
// other callers' transactions that queue while one is committing (group
// commit).
//
// A caller queues its transaction, then either takes the turn and leads —
// runs up to maxGroup queued transactions, its own among them unless an
// earlier leader took it — or receives the outcome from the leader that
// ran it. A caller whose context ends while its transaction is still
// queued withdraws it (nothing written) and returns the context's error;
// once a leader has taken it, it waits for the outcome.
//
// Within the group each transaction runs in a savepoint, in queue order:
// one that fails, panics or whose context ended is rolled back to its
// savepoint alone and changes nothing; the others commit together, so
// each sees the writes of those before it, as if they had committed one
// by one in that order. None is answered before the COMMIT returns: a
// lease is never handed out before its commit is durable. If the COMMIT,
// or a savepoint statement, fails, the whole group is rolled back and
// every member that would have committed gets that error. A group of one
// is a plain transaction, without a savepoint. fn may run on another
// caller's goroutine (the leader's): it must not end it (runtime.Goexit).
func (h *heldConn) run(ctx context.Context, fn func(txn) error) error {
	m := &member{ctx: ctx, fn: fn, done: make(chan outcome, 1)}
	h.mu.Lock()
	h.queue = append(h.queue, m)
	h.mu.Unlock()
	for {
		select {
		case o := <-m.done:
			return o.result()
		case h.turn <- struct{}{}:
			h.lead()
		case <-ctx.Done():
			if h.withdraw(m) {
				return ctx.Err()
			}
			return (<-m.done).result()
		}
	}
}

// result returns the outcome's error, or panics again with fn's value in
// the caller's goroutine.
func (o outcome) result() error {
	if o.panicked {
		panic(o.value)
	}
	return o.err
}

// withdraw removes m from the queue, reporting whether it was still there.
func (h *heldConn) withdraw(m *member) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, q := range h.queue {
		if q == m {
			h.queue = append(h.queue[:i], h.queue[i+1:]...)
			return true
		}
	}
	return false
}

// lead runs one group from the head of the queue, answers its members and
// releases the turn, which its caller took.
func (h *heldConn) lead() {
	defer h.release()
	h.mu.Lock()
	n := min(len(h.queue), maxGroup)
	group := append([]*member(nil), h.queue[:n]...)
	h.queue = append(h.queue[:0], h.queue[n:]...)
	h.mu.Unlock()
	if n == 0 {
		return
	}
	for i, o := range h.commitGroup(group) {
		group[i].done <- o
	}
}

// commitGroup runs the group's transactions in one transaction and commits
// it (see run); the caller holds the turn.
func (h *heldConn) commitGroup(group []*member) []outcome {
	out := make([]outcome, len(group))
	// A member whose context ended before the group began gets its
	// context's error.
	none := func(err error) []outcome {
		for i, m := range group {
			out[i] = outcome{err: cmp.Or(m.ctx.Err(), err)}
		}
		return out
	}
	if h.conn == nil {
		ctx, cancel := anyLive(group)
		err := h.open(ctx)
		cancel()
		if err != nil {
			return none(err)
		}
	}
	if err := h.beginGroup(group); err != nil {
		h.abort()
		return none(err)
	}
	if len(group) == 1 { // a plain transaction
		if out[0] = h.runMember(group[0]); !out[0].keeps(group[0]) {
			h.abort()
			return out
		}
		return h.commit(group, out, []bool{true})
	}
	kept := make([]bool, len(group))
	// lost ends the group with err: every member it would have committed
	// gets err, and those it had not run yet are retried (errRetry: they
	// wrote nothing).
	lost := func(from int, err error) []outcome {
		h.abort()
		for i := range out {
			switch {
			case kept[i] || i == from:
				out[i] = outcome{err: err}
			case i > from:
				out[i] = outcome{err: errRetry}
			}
		}
		return out
	}
	for i, m := range group {
		if err := m.ctx.Err(); err != nil {
			out[i] = outcome{err: err}
			continue
		}
		if _, err := h.stmts[savepointSQL].ExecContext(context.Background()); err != nil {
			return lost(i, err)
		}
		out[i] = h.runMember(m)
		if kept[i] = out[i].keeps(m); !kept[i] {
			if _, err := h.stmts[rollbackToSQL].ExecContext(context.Background()); err != nil {
				return lost(i, fmt.Errorf("sqlstore: a failed transaction of a group could not be rolled back alone: %w", err))
			}
		}
		if _, err := h.stmts[releaseSQL].ExecContext(context.Background()); err != nil {
			return lost(i, err)
		}
	}
	return h.commit(group, out, kept)
}

// beginGroup begins the group's transaction. BEGIN runs with no context
// for the driver to watch. When another connection holds the write lock,
// it is tried again after the pauses of SQLite's own busy handler, for up
// to lockTimeout, while any member's caller still waits.
func (h *heldConn) beginGroup(group []*member) error {
	begin := func() error {
		_, err := h.stmts[h.begin].ExecContext(context.Background())
		return err
	}
	err := begin()
	if err == nil || !h.busy(err) {
		return err
	}
	ctx, cancel := anyLive(group)
	defer cancel()
	deadline := time.Now().Add(lockTimeout)
	for i := 0; h.busy(err); i++ {
		pause := min(lockDelays[min(i, len(lockDelays)-1)]*time.Millisecond, time.Until(deadline))
		if pause <= 0 {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		err = begin()
	}
	return err
}

// keeps reports whether a member's transaction stays in the group: fn
// returned nil or a commitThen, and its caller is still there. A caller
// that has gone gets its context's error instead, and its transaction
// changes nothing, as a lone transaction's would.
func (o *outcome) keeps(m *member) bool {
	if o.panicked || (o.err != nil && !isCommitThen(o.err)) {
		return false
	}
	if err := m.ctx.Err(); err != nil {
		*o = outcome{err: err}
		return false
	}
	return true
}

// commit commits the group's transaction: the kept members get their
// outcome (a commitThen's err), or the COMMIT's error.
func (h *heldConn) commit(group []*member, out []outcome, kept []bool) []outcome {
	_, err := h.stmts[commitSQL].ExecContext(context.Background())
	if err != nil {
		h.abort()
	}
	for i := range group {
		switch ct, isCT := out[i].err.(commitThen); {
		case !kept[i]:
		case err != nil:
			out[i] = outcome{err: err}
		case isCT:
			out[i].err = ct.err
		}
	}
	return out
}

// runMember runs a member's fn on the held transaction, catching a panic.
func (h *heldConn) runMember(m *member) (o outcome) {
	defer func() {
		if p := recover(); p != nil {
			o = outcome{panicked: true, value: p}
		}
	}()
	return outcome{err: m.fn(txn{heldTx{h}})}
}

func isCommitThen(err error) bool {
	_, ok := err.(commitThen)
	return ok
}

// anyLive returns a context that ends once every member's context has.
func anyLive(group []*member) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.Background())
	left := atomic.Int32{}
	left.Store(int32(len(group)))
	stops := make([]func() bool, 0, len(group))
	for _, m := range group {
		stops = append(stops, context.AfterFunc(m.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		}))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}
