package reliability

import (
	"context"
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// TestReplayViolations: the log of a pool cell's life replays to the
// stored states; a log missing an event, or a state changed behind the
// log's back, is reported.
func TestReplayViolations(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "r.db")
	st, err := sqlite.Open(ctx, path, sqlite.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	for range 2 {
		id := uuid.Must(uuid.NewV7())
		if _, err := st.CreateMember(ctx, store.CreateMemberParams{CellID: id, Pool: "p", TenantID: "t", Now: now}); err != nil {
			t.Fatal(err)
		}
		rel := lease.Release{ReleaseSetID: "r", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: strings.Repeat("a", 64), Signature: "s"}
		if _, err := st.AdmitMember(ctx, store.AdmitParams{CellID: id, Pool: "p", WorkerID: "pool:p", ProviderCellID: id.String(),
			Release: rel, ReadyDeadline: now.Add(time.Hour), Now: now}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.BeginStop(ctx, store.StopIntent{CellID: id, From: []lease.MemberState{lease.MemberReady},
			Disposition: lease.Destroyed, EventReason: store.ReasonReadyTTL, Now: now}); err != nil {
			t.Fatal(err)
		}
	}
	db, err := OpenDB("sqlite://" + path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	s, err := db.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v := s.ReplayViolations(); len(v) != 0 || len(s.Events) != 10 {
		t.Fatalf("a consistent log: %d events, violations %v", len(s.Events), v)
	}
	raw, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Exec(`DELETE FROM events WHERE id = 3`); err != nil {
		t.Fatal(err)
	}
	if s, err = db.Snapshot(ctx); err != nil {
		t.Fatal(err)
	}
	if v := s.ReplayViolations(); len(v) == 0 {
		t.Error("a log without an event replays without a violation")
	}
}
