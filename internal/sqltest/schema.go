package sqltest

import (
	"io/fs"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/pressly/goose/v3"

	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
)

// checkSchemaGuards leases a cell through a store and then tries, through
// the plain connection, what the schema itself must refuse whoever asks:
// deleting a cell, returning it to inventory, rewriting what it is, its
// lease, the claim that leased it or when it retired, and changing,
// deleting or adding an installation identity. Each attempt must fail and
// change nothing; a harmless update must still succeed, so the refusals
// are not an accident.
func checkSchemaGuards(t *testing.T, d database) {
	s := d.store(t)
	inv := NewInventory(t)
	inv.Prepare(t, s, time.Hour)
	claimID := uuid.Must(uuid.NewV7())
	leased := inv.lease(t, s, claimID).CellID
	ready := inv.Prepare(t, s, time.Hour).ID
	retired := inv.Prepare(t, s, 10*time.Second).ID
	if n, err := s.ExpireUnmanaged(t.Context(), inv.Now.Add(20*time.Second)); err != nil || n != 1 {
		t.Fatalf("ExpireUnmanaged = %d, %v; want the one cell past its deadline", n, err)
	}
	exec := func(q string, args ...any) error {
		_, err := d.db.ExecContext(t.Context(), d.rebind(q), args...)
		return err
	}
	if err := exec(`UPDATE cells SET updated_us = updated_us + 1 WHERE id = ?`, leased.String()); err != nil {
		t.Fatalf("a harmless update failed: %v", err)
	}
	before := cells(t, s, leased, ready, retired)
	installation := installationForm(t, s)
	for _, c := range []struct {
		what, q string
		id      uuid.UUID
	}{
		{"delete a cell", `DELETE FROM cells WHERE id = ?`, ready},
		{"return a leased cell to inventory", `UPDATE cells SET state = 'ready', generation = 1, lease_id = NULL,
			organization_id = NULL, workspace_id = NULL, thread_id = NULL, runner_session_id = NULL,
			lease_expires_us = NULL, attestation_digest = NULL, claim_id = NULL WHERE id = ?`, leased},
		{"move a cell to another tenant", `UPDATE cells SET tenant_id = 'tenant-z' WHERE id = ?`, ready},
		{"extend a ready deadline", `UPDATE cells SET ready_deadline_us = ready_deadline_us + 1 WHERE id = ?`, ready},
		// A lease may grow (renewal, CONTRACT §20), never shrink; the
		// expiry the claim granted and when it leased never change.
		{"shorten a lease", `UPDATE cells SET lease_expires_us = lease_expires_us - 1 WHERE id = ?`, leased},
		{"rewrite the expiry a claim granted", `UPDATE cells SET lease_granted_us = 5 WHERE id = ?`, leased},
		{"rewrite when a lease was made", `UPDATE cells SET leased_us = leased_us + 1 WHERE id = ?`, leased},
		{"rebind a lease", `UPDATE cells SET organization_id = 'org-z' WHERE id = ?`, leased},
		{"swap an attestation", `UPDATE cells SET attestation_digest = '` + strings.Repeat("0", 64) + `' WHERE id = ?`, leased},
		{"rewrite the claim of a lease", `UPDATE cells SET claim_id = '` + uuid.NewString() + `' WHERE id = ?`, leased},
		{"name a claim for an unleased cell", `UPDATE cells SET claim_id = '` + uuid.NewString() + `' WHERE id = ?`, ready},
		{"revive a retired cell", `UPDATE cells SET state = 'ready', retired_us = NULL WHERE id = ?`, retired},
		{"rewrite when a cell retired", `UPDATE cells SET retired_us = retired_us + 1 WHERE id = ?`, retired},
		{"retire a live cell in name only", `UPDATE cells SET retired_us = 1 WHERE id = ?`, ready},
	} {
		if err := exec(c.q, c.id.String()); err == nil {
			t.Errorf("the schema let an operator %s", c.what)
		}
	}
	for _, c := range []struct{ what, q string }{
		{"change the installation", `UPDATE installation SET id = '` + strings.Repeat("0", 32) + `'`},
		{"delete the installation", `DELETE FROM installation`},
		{"add a second installation", `INSERT INTO installation (singleton, id) VALUES (2, '` + strings.Repeat("1", 32) + `')`},
	} {
		if err := exec(c.q); err == nil {
			t.Errorf("the schema let an operator %s", c.what)
		}
	}
	if got := installationForm(t, s); got != installation {
		t.Errorf("Installation after refused writes = %q, want %q", got, installation)
	}
	if after := cells(t, s, leased, ready, retired); !reflect.DeepEqual(after, before) {
		t.Errorf("cells after refused writes:\n got  %+v\n want %+v", after, before)
	}
	claimOf(t, s, leased, claimID)
}

// checkMigrateDown writes through a store a fenced lease, an unfenced one
// and an empty fenced claim, migrates the database down to version 1 with
// the dialect's migrations, opens a store again (which migrates up), and
// checks that nothing was lost: the claims replay, the worker still sees
// which claim leased its cell, and the last ready cell is still claimable.
func checkMigrateDown(t *testing.T, d database, dialect goose.Dialect, migrations fs.FS) {
	s := d.open(t, d.dsn, true)
	inv := NewInventory(t)
	fencedCell, unfencedCell, last := inv.Prepare(t, s, time.Hour), inv.Prepare(t, s, time.Hour), inv.Prepare(t, s, time.Hour)
	claimX, claimY := uuid.Must(uuid.NewV7()), uuid.Must(uuid.NewV7())
	lx := inv.lease(t, s, claimX)
	lu := inv.lease(t, s, uuid.Nil)
	gvisor := testenv.Release(inv.Keys, lease.GVisorLowerRisk) // no inventory
	if res, err := s.Claim(t.Context(), inv.Claim(claimY, gvisor)); err != nil || res.Lease != nil {
		t.Fatalf("Claim for a release without inventory = %+v, %v; want empty", res, err)
	}
	if lx.CellID != fencedCell.ID || lu.CellID != unfencedCell.ID {
		t.Fatalf("leased %s and %s, want %s and %s", lx.CellID, lu.CellID, fencedCell.ID, unfencedCell.ID)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	p, err := goose.NewProvider(dialect, d.db, migrations)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.DownTo(t.Context(), 1); err != nil {
		t.Fatalf("migrate down to 1: %v", err)
	}
	s = d.store(t) // migrates up, as a deployment would, on the store's own connection settings
	claimOf(t, s, fencedCell.ID, claimX)
	claimOf(t, s, unfencedCell.ID, uuid.Nil)
	if res := inv.claim(t, s, claimX); !res.Replayed || res.Lease == nil || res.Lease.ID != lx.ID {
		t.Errorf("retried claim = %+v, want a replay of lease %s", res, lx.ID)
	}
	if res, err := s.Claim(t.Context(), inv.Claim(claimY, gvisor)); err != nil || !res.Replayed || res.Lease != nil {
		t.Errorf("retried empty claim = %+v, %v; want an empty replay", res, err)
	}
	claimZ := uuid.Must(uuid.NewV7())
	if l := inv.lease(t, s, claimZ); l.CellID != last.ID {
		t.Errorf("claim after migrating leased %s, want %s", l.CellID, last.ID)
	}
	claimOf(t, s, last.ID, claimZ)
	wantCounts(t, s, map[lease.State]int{lease.Leased: 3})
}
