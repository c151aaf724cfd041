package storetest

import (
	"database/sql"
	"io/fs"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pressly/goose/v3"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// CheckSchemaGuards leases a cell through s and then tries, through db (a
// connection to the same database, with the dialect's placeholders made by
// rebind), what the schema itself must refuse whoever asks: deleting a
// cell, returning it to inventory, rewriting what it is, its lease, the
// claim that leased it or when it retired, and changing, deleting or
// adding an installation identity. Each attempt must fail and
// change nothing; a harmless update must still succeed, so the refusals are
// not an accident.
func CheckSchemaGuards(t *testing.T, s store.Store, db *sql.DB, rebind func(string) string) {
	t.Helper()
	e := envOver(t, s)
	e.prepare()
	claimID := newID()
	leased := e.cell(workerA, e.mustLease(fenced(claimID)).CellID)
	ready := e.prepare()
	retired := e.prepare(func(p *store.PrepareParams) { p.ExpiresAt = e.now.Add(10 * time.Second) })
	if n, err := s.ExpireUnmanaged(t.Context(), e.now.Add(20*time.Second)); err != nil || n != 1 {
		t.Fatalf("ExpireUnmanaged = %d, %v; want the one cell past its deadline", n, err)
	}
	retired = e.cell(workerA, retired.ID)
	exec := func(q string, args ...any) error {
		_, err := db.ExecContext(t.Context(), rebind(q), args...)
		return err
	}
	if err := exec(`UPDATE cells SET updated_us = updated_us + 1 WHERE id = ?`, leased.ID.String()); err != nil {
		t.Fatalf("a harmless update failed: %v", err)
	}
	for _, c := range []struct {
		what, q string
		id      uuid.UUID
	}{
		{"delete a cell", `DELETE FROM cells WHERE id = ?`, ready.ID},
		{"return a leased cell to inventory", `UPDATE cells SET state = 'ready', generation = 1, lease_id = NULL,
			organization_id = NULL, workspace_id = NULL, thread_id = NULL, runner_session_id = NULL,
			lease_expires_us = NULL, attestation_digest = NULL, claim_id = NULL WHERE id = ?`, leased.ID},
		{"move a cell to another tenant", `UPDATE cells SET tenant_id = 'tenant-z' WHERE id = ?`, ready.ID},
		{"extend a ready deadline", `UPDATE cells SET ready_deadline_us = ready_deadline_us + 1 WHERE id = ?`, ready.ID},
		{"extend a lease", `UPDATE cells SET lease_expires_us = lease_expires_us + 1 WHERE id = ?`, leased.ID},
		{"rebind a lease", `UPDATE cells SET organization_id = 'org-z' WHERE id = ?`, leased.ID},
		{"swap an attestation", `UPDATE cells SET attestation_digest = '` + strings.Repeat("0", 64) + `' WHERE id = ?`, leased.ID},
		{"rewrite the claim of a lease", `UPDATE cells SET claim_id = '` + newID().String() + `' WHERE id = ?`, leased.ID},
		{"name a claim for an unleased cell", `UPDATE cells SET claim_id = '` + newID().String() + `' WHERE id = ?`, ready.ID},
		{"revive a retired cell", `UPDATE cells SET state = 'ready', retired_us = NULL WHERE id = ?`, retired.ID},
		{"rewrite when a cell retired", `UPDATE cells SET retired_us = retired_us + 1 WHERE id = ?`, retired.ID},
		{"retire a live cell in name only", `UPDATE cells SET retired_us = 1 WHERE id = ?`, ready.ID},
	} {
		if err := exec(c.q, c.id.String()); err == nil {
			t.Errorf("the schema let an operator %s", c.what)
		}
	}
	installation := installationOf(t, s)
	for _, c := range []struct{ what, q string }{
		{"change the installation", `UPDATE installation SET id = '` + strings.Repeat("0", 32) + `'`},
		{"delete the installation", `DELETE FROM installation`},
		{"add a second installation", `INSERT INTO installation (singleton, id) VALUES (2, '` + strings.Repeat("1", 32) + `')`},
	} {
		if err := exec(c.q); err == nil {
			t.Errorf("the schema let an operator %s", c.what)
		}
	}
	if got := installationOf(t, s); got != installation {
		t.Errorf("Installation after refused writes = %q, want %q", got, installation)
	}
	e.wantCell(e.cell(workerA, ready.ID), ready, "ready cell after refused writes")
	e.wantCell(e.cell(workerA, retired.ID), retired, "retired cell after refused writes")
	got, info, err := s.WorkerCell(t.Context(), workerA, leased.ID)
	if err != nil {
		t.Fatal(err)
	}
	e.wantCell(got, leased, "leased cell after refused writes")
	if info == nil || info.ClaimID != claimID {
		t.Errorf("WorkerCell claim = %+v, want claim %s", info, claimID)
	}
}

// CheckMigrateDown writes through open's store a fenced lease, an unfenced
// one and an empty fenced claim, migrates db down to version 1 with the
// dialect's migrations, opens the store again (which migrates up), and
// checks that nothing was lost: the claims replay, the worker still sees
// which claim leased its cell, and the last ready cell is still claimable.
// open returns a store over db's database on every call, migrating it.
func CheckMigrateDown(t *testing.T, open func(t *testing.T) store.Store, db *sql.DB, dialect goose.Dialect, migrations fs.FS) {
	t.Helper()
	s := open(t)
	e := envOver(t, s)
	fencedCell, unfencedCell, last := e.prepare(), e.prepare(), e.prepare()
	claimX, claimY := newID(), newID()
	lx := e.mustLease(fenced(claimX))
	lu := e.mustLease()
	e.mustEmpty(fenced(claimY), withRelease(e.gvis))
	if lx.CellID != fencedCell.ID || lu.CellID != unfencedCell.ID {
		t.Fatalf("leased %s and %s, want %s and %s", lx.CellID, lu.CellID, fencedCell.ID, unfencedCell.ID)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	p, err := goose.NewProvider(dialect, db, migrations)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(t.Context(), 1); err != nil {
		t.Fatalf("migrate down to 1: %v", err)
	}
	s = open(t) // migrates up, as a deployment would, on the store's own connection settings
	defer s.Close()
	e.s.Store = s // the same history, over the migrated database
	for _, c := range []struct {
		cell  uuid.UUID
		claim uuid.UUID
	}{{fencedCell.ID, claimX}, {unfencedCell.ID, uuid.Nil}} {
		_, info, err := s.WorkerCell(t.Context(), workerA, c.cell)
		if err != nil || info == nil || info.ClaimID != c.claim {
			t.Errorf("WorkerCell(%s) claim = %+v, %v; want claim %s", c.cell, info, err, c.claim)
		}
	}
	if res := e.claim(fenced(claimX)); !res.Replayed || res.Lease == nil || res.Lease.ID != lx.ID {
		t.Errorf("retried claim = %+v, want a replay of lease %s", res, lx.ID)
	}
	if res := e.claim(fenced(claimY), withRelease(e.gvis)); !res.Replayed || res.Lease != nil {
		t.Errorf("retried empty claim = %+v, want an empty replay", res)
	}
	claimZ := newID()
	if l := e.mustLease(fenced(claimZ)); l.CellID != last.ID {
		t.Errorf("claim after migrating leased %s, want %s", l.CellID, last.ID)
	}
	if _, info, err := s.WorkerCell(t.Context(), workerA, last.ID); err != nil || info == nil || info.ClaimID != claimZ {
		t.Errorf("WorkerCell(%s) claim = %+v, %v; want claim %s", last.ID, info, err, claimZ)
	}
	e.wantCellCounts(map[lease.State]int{lease.Leased: 3})
}
