package sqlstore

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

const (
	heldInsert = `INSERT INTO t (n) VALUES (?) RETURNING id`
	heldCount  = `SELECT count(*) FROM t`
)

// newHeld returns a heldConn over a fresh SQLite file with one table, t,
// and a second pool on the same file to count its rows.
func newHeld(t *testing.T) (*heldConn, func() int) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "held.db")
	open := func() *sqlx.DB {
		db, err := sqlx.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)")
		if err != nil {
			t.Fatal(err)
		}
		return db
	}
	db, other := open(), open()
	t.Cleanup(func() { other.Close() })
	if _, err := db.Exec(`CREATE TABLE t (id INTEGER PRIMARY KEY, n INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	h := newHeldConn(db, "BEGIN IMMEDIATE", busy, []string{heldInsert, heldCount})
	t.Cleanup(func() { _ = h.close() })
	count := func() int {
		t.Helper()
		var n int
		if err := other.Get(&n, heldCount); err != nil {
			t.Fatal(err)
		}
		return n
	}
	return h, count
}

// busy is the SQLite store's Retryable, as BEGIN IMMEDIATE meets it.
func busy(err error) bool {
	e, ok := errors.AsType[*sqlite.Error](err)
	return ok && e.Code()&0xff == sqlite3.SQLITE_BUSY
}

// soon is a context for a call that must not wait for the turn.
func soon(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// TestHeldTurn: one caller at a time; a waiter gives up when its context
// ends; a scanned row and a finished transaction release the turn.
func TestHeldTurn(t *testing.T) {
	h, count := newHeld(t)
	var id int
	if err := h.row(soon(t), heldInsert, 1).Scan(&id); err != nil || id != 1 {
		t.Fatalf("row: id %d, %v", id, err)
	}
	err := h.run(soon(t), func(tx txn) error {
		waiting, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if _, err := h.exec(waiting, heldInsert, 2); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("exec while a transaction holds the turn: %v, want context.DeadlineExceeded", err)
		}
		_, err := tx.exec(soon(t), heldInsert, 3)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.exec(soon(t), heldInsert, 4); err != nil {
		t.Fatalf("exec after commit: %v", err)
	}
	if n := count(); n != 3 {
		t.Errorf("%d rows, want 3", n)
	}
}

// TestHeldEnds: a failed transaction, and one whose context ended before
// its commit, change nothing, and the connection goes on.
func TestHeldEnds(t *testing.T) {
	h, count := newHeld(t)
	errFailed := errors.New("failed")
	err := h.run(soon(t), func(tx txn) error {
		if _, err := tx.exec(soon(t), heldInsert, 1); err != nil {
			return err
		}
		return errFailed
	})
	if !errors.Is(err, errFailed) {
		t.Errorf("failed transaction: %v, want its error", err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	err = h.run(ctx, func(tx txn) error {
		if _, err := tx.exec(ctx, heldInsert, 2); err != nil {
			return err
		}
		cancel()
		if _, err := tx.exec(ctx, heldInsert, 3); !errors.Is(err, context.Canceled) {
			t.Errorf("statement after the context ended: %v, want context.Canceled", err)
		}
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("commit after the context ended: %v, want context.Canceled", err)
	}
	if n := count(); n != 0 {
		t.Errorf("%d rows after a failed and a cancelled transaction, want 0", n)
	}
	if _, err := h.exec(soon(t), heldInsert, 4); err != nil {
		t.Fatalf("exec afterwards: %v", err)
	}
}

// TestHeldDrop: a connection in doubt is dropped and replaced on next use;
// close may be called twice, and a closed heldConn fails without waiting.
func TestHeldDrop(t *testing.T) {
	h, count := newHeld(t)
	if _, err := h.exec(soon(t), heldInsert, 1); err != nil {
		t.Fatal(err)
	}
	first := h.conn
	h.turn <- struct{}{}
	h.abort() // ROLLBACK with no transaction open fails: dropped
	h.release()
	if h.conn != nil {
		t.Fatal("abort kept a connection whose ROLLBACK failed")
	}
	if _, err := h.exec(soon(t), heldInsert, 2); err != nil {
		t.Fatalf("exec after a drop: %v", err)
	}
	if h.conn == nil || h.conn == first {
		t.Error("exec after a drop did not open a new connection")
	}
	if n := count(); n != 2 {
		t.Errorf("%d rows, want 2", n)
	}
	for i := range 2 {
		if err := h.close(); err != nil {
			t.Errorf("close %d: %v", i+1, err)
		}
	}
	if _, err := h.exec(soon(t), heldInsert, 3); err == nil {
		t.Error("exec after close succeeded")
	}
}

// TestHeldGroup: transactions that queue while the turn is taken commit as
// one group, each in its own savepoint. In queue order each sees the
// writes of those before it; the one that fails, the one that panics and
// the one whose caller left change nothing, and only they; a commitThen
// commits and still reports its error; nothing is visible to another
// connection before the group's one COMMIT.
func TestHeldGroup(t *testing.T) {
	h, count := newHeld(t)
	h.turn <- struct{}{} // hold the turn while the group queues
	errFailed := errors.New("failed")
	errReported := errors.New("reported after the commit")
	gone, leave := context.WithCancel(t.Context())
	committed := -1 // rows another connection sees while the last transaction runs
	type call struct {
		ctx  context.Context
		n    int
		then func() error // after the insert: fn's result, or a panic
	}
	calls := []call{
		{soon(t), 1, func() error { return nil }},
		{soon(t), 2, func() error { return errFailed }},
		{soon(t), 3, func() error { panic("boom") }},
		{soon(t), 4, func() error { return commitThen{errReported} }},
		{gone, 5, func() error { leave(); return nil }}, // its caller leaves while it runs
		{soon(t), 6, func() error { committed = count(); return nil }},
	}
	type result struct {
		err      error
		panicked any
		before   int // rows this transaction saw before its insert
	}
	results := make([]result, len(calls))
	var wg sync.WaitGroup
	for i, c := range calls {
		// Queue them one by one, in order.
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { results[i].panicked = recover() }()
			results[i].err = h.run(c.ctx, func(tx txn) error {
				if err := tx.query(c.ctx, heldCount).Scan(&results[i].before); err != nil {
					return err
				}
				if _, err := tx.exec(c.ctx, heldInsert, c.n); err != nil {
					return err
				}
				return c.then()
			})
		}()
		waitQueued(t, h, i+1)
	}
	if n := count(); n != 0 {
		t.Fatalf("%d rows before the group ran", n)
	}
	h.release()
	wg.Wait()
	want := []result{{nil, nil, 0}, {errFailed, nil, 1}, {nil, "boom", 1}, {errReported, nil, 1}, {context.Canceled, nil, 2}, {nil, nil, 2}}
	for i, w := range want {
		r := results[i]
		if !errors.Is(r.err, w.err) || (w.err == nil && r.err != nil) || r.panicked != w.panicked || r.before != w.before {
			t.Errorf("transaction %d: err %v, panic %v, saw %d rows; want %v, %v, %d", i+1, r.err, r.panicked, r.before, w.err, w.panicked, w.before)
		}
	}
	if committed != 0 {
		t.Errorf("another connection saw %d rows while the group ran, want 0: one COMMIT for the group", committed)
	}
	var ns []int
	if err := h.db.Select(&ns, `SELECT n FROM t ORDER BY id`); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ns, []int{1, 4, 6}) {
		t.Errorf("rows %v, want [1 4 6]", ns)
	}
}

// TestHeldGroupWithdraw: a caller whose context ends while its transaction
// is queued withdraws it: it returns the context's error and nothing runs.
func TestHeldGroupWithdraw(t *testing.T) {
	h, count := newHeld(t)
	h.turn <- struct{}{}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	ran := false
	err := h.run(ctx, func(tx txn) error { ran = true; return nil })
	if !errors.Is(err, context.DeadlineExceeded) || ran {
		t.Errorf("run while the turn is held: %v (ran %v), want context.DeadlineExceeded, not run", err, ran)
	}
	h.release()
	if len(h.queue) != 0 {
		t.Errorf("%d transactions left queued", len(h.queue))
	}
	if err := h.run(soon(t), func(tx txn) error { _, err := tx.exec(soon(t), heldInsert, 1); return err }); err != nil {
		t.Fatal(err)
	}
	if n := count(); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}

// TestHeldGroupLost: a member that ends the group's transaction (here by
// rolling it back itself) loses the group: those before it get the error,
// those after it errRetry (they wrote nothing), and no row is written.
func TestHeldGroupLost(t *testing.T) {
	h, count := newHeld(t)
	h.turn <- struct{}{}
	fns := []func(tx txn) error{
		func(tx txn) error { _, err := tx.exec(soon(t), heldInsert, 1); return err },
		func(tx txn) error {
			_ = tx.query(soon(t), "ROLLBACK").Scan()
			return errors.New("ended the transaction")
		},
		func(tx txn) error { _, err := tx.exec(soon(t), heldInsert, 3); return err },
	}
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = h.run(soon(t), fn) }()
		waitQueued(t, h, i+1)
	}
	h.release()
	wg.Wait()
	if errs[0] == nil || errs[1] == nil || !errors.Is(errs[2], errRetry) {
		t.Errorf("errors %v; want two errors, then errRetry", errs)
	}
	if n := count(); n != 0 {
		t.Errorf("%d rows after a lost group, want 0", n)
	}
	if err := h.run(soon(t), fns[2]); err != nil {
		t.Errorf("a transaction after a lost group: %v", err)
	}
}

// waitQueued waits until n transactions are queued.
func waitQueued(t *testing.T, h *heldConn, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		h.mu.Lock()
		q := len(h.queue)
		h.mu.Unlock()
		if q >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d transactions queued, want %d", q, n)
		}
	}
}

// TestHeldLockWait: while another connection holds the write lock, a
// write waits for it — BEGIN runs with no context for the driver to watch,
// and the held connection waits itself — and gives up once its caller's
// context ends, having written nothing; it goes through once the lock is
// released.
func TestHeldLockWait(t *testing.T) {
	h, count := newHeld(t)
	var seq int
	var name, path string
	if err := h.db.QueryRow(`PRAGMA database_list`).Scan(&seq, &name, &path); err != nil {
		t.Fatal(err)
	}
	other, err := sqlx.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	holder, err := other.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if _, err := holder.ExecContext(t.Context(), `BEGIN IMMEDIATE`); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := h.exec(ctx, heldInsert, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("exec while another connection holds the lock: %v, want context.DeadlineExceeded", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := h.exec(soon(t), heldInsert, 2)
		done <- err
	}()
	time.Sleep(50 * time.Millisecond) // let it wait
	if _, err := holder.ExecContext(t.Context(), `COMMIT`); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("exec once the lock was released: %v", err)
	}
	if n := count(); n != 1 {
		t.Errorf("%d rows, want 1", n)
	}
}
