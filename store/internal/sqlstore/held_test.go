package sqlstore

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	_ "modernc.org/sqlite"
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
	h := newHeldConn(db, "BEGIN IMMEDIATE", []string{heldInsert, heldCount})
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
	tx, err := h.beginTx(soon(t))
	if err != nil {
		t.Fatal(err)
	}
	waiting, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := h.exec(waiting, heldInsert, 2); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("exec while a transaction holds the turn: %v, want context.DeadlineExceeded", err)
	}
	if _, err := tx.exec(soon(t), heldInsert, 3); err != nil {
		t.Fatal(err)
	}
	if err := tx.commit(soon(t)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.exec(soon(t), heldInsert, 4); err != nil {
		t.Fatalf("exec after commit: %v", err)
	}
	if n := count(); n != 3 {
		t.Errorf("%d rows, want 3", n)
	}
}

// TestHeldEnds: a rollback, and a commit whose context has ended, change
// nothing, and the connection goes on.
func TestHeldEnds(t *testing.T) {
	h, count := newHeld(t)
	tx, err := h.beginTx(soon(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.exec(soon(t), heldInsert, 1); err != nil {
		t.Fatal(err)
	}
	tx.rollback()
	ctx, cancel := context.WithCancel(t.Context())
	if tx, err = h.beginTx(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.exec(ctx, heldInsert, 2); err != nil {
		t.Fatal(err)
	}
	cancel()
	if _, err := tx.exec(ctx, heldInsert, 3); !errors.Is(err, context.Canceled) {
		t.Errorf("statement after the context ended: %v, want context.Canceled", err)
	}
	if err := tx.commit(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("commit after the context ended: %v, want context.Canceled", err)
	}
	if n := count(); n != 0 {
		t.Errorf("%d rows after a rollback and a cancelled commit, want 0", n)
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
	if err := h.take(soon(t)); err != nil {
		t.Fatal(err)
	}
	h.settle() // ROLLBACK with no transaction open fails: dropped
	if h.conn != nil {
		t.Fatal("settle kept a connection whose ROLLBACK failed")
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
