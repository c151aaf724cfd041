package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// checkLockWait has another connection of db hold what the store's writes
// wait for — lock is the statements that take it, in a transaction the
// check rolls back — and checks that a write whose context ends while it
// waits returns the context's error, well before any lock timeout of the
// database, and changes nothing; and that the store works once the lock
// is gone.
func checkLockWait(t *testing.T, s store.Store, db *sql.DB, lock ...string) {
	inv := NewInventory(t)
	ready := inv.Prepare(t, s, time.Hour)
	conn, err := db.Conn(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, q := range lock {
		if _, err := conn.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	// A lock timeout, if the database has one, is seconds: the SQLite
	// store's is ten.
	const wait, soon = 200 * time.Millisecond, 5 * time.Second
	claim := inv.Claim(uuid.Must(uuid.NewV7()), inv.Release)
	prep := inv.prepareParams(time.Hour)
	for what, write := range map[string]func(ctx context.Context) error{
		"Claim":   func(ctx context.Context) error { _, err := s.Claim(ctx, claim); return err },
		"Prepare": func(ctx context.Context) error { _, err := s.Prepare(ctx, prep); return err },
	} {
		ctx, cancel := context.WithTimeout(t.Context(), wait)
		start := time.Now()
		err := write(ctx)
		took := time.Since(start)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || took > soon {
			t.Errorf("%s behind a held lock returned %v after %s; want context.DeadlineExceeded within %s", what, err, took, soon)
		}
	}
	if _, err := conn.ExecContext(t.Context(), "ROLLBACK"); err != nil {
		t.Fatal(err)
	}
	wantCounts(t, s, map[lease.State]int{lease.Ready: 1})
	res, err := s.Claim(t.Context(), claim)
	if err != nil || res.Replayed || res.Lease == nil || res.Lease.CellID != ready.ID {
		t.Errorf("Claim after the lock = %+v, %v; want a new lease of %s", res, err, ready.ID)
	}
	if _, err := s.Prepare(t.Context(), prep); err != nil {
		t.Errorf("Prepare after the lock: %v", err)
	}
	wantCounts(t, s, map[lease.State]int{lease.Ready: 1, lease.Leased: 1})
}
