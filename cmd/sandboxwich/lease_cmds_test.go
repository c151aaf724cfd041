package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// prepareCell registers a ready cell of the test server's worker.
func (s *cliTestServer) prepareCell(t *testing.T) {
	t.Helper()
	w := sandboxwich.Worker{ID: s.workerID, TenantID: "acme", RuntimeClasses: []lease.RuntimeClass{s.release.RuntimeClass}}
	if _, err := s.plane.Prepare(context.Background(), w, sandboxwich.PrepareRequest{CellID: uuid.Must(uuid.NewV7()),
		Release: s.release, ProviderCellID: "vm-" + uuid.NewString(), ExpiresAt: time.Now().Add(10 * time.Minute)}); err != nil {
		t.Fatal(err)
	}
}

// claimLease claims a cell through the CLI for a runner session and
// returns its lease ID and attestation file.
func (s *cliTestServer) claimLease(t *testing.T, te *cliTestEnv, session string) (uuid.UUID, string) {
	t.Helper()
	att := filepath.Join(t.TempDir(), "lease.att")
	if code := te.run(s.claimArgs(att, "--session", session, "--json")...); code != 0 {
		t.Fatalf("claim: exit %d\n%s", code, te.stderr)
	}
	var out claimJSON
	if err := json.Unmarshal(te.stdout.Bytes(), &out); err != nil || out.Lease == nil {
		t.Fatalf("claim --json = %s (%v)", te.stdout, err)
	}
	return out.Lease.LeaseID, att
}

func decodeStdout[T any](t *testing.T, te *cliTestEnv) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(te.stdout.Bytes(), &v); err != nil {
		t.Fatalf("stdout %s: %v", te.stdout, err)
	}
	return v
}

func listedIDs(ls []wire.LeaseSummary) []uuid.UUID {
	out := make([]uuid.UUID, len(ls))
	for i, l := range ls {
		out[i] = l.LeaseID
	}
	return out
}

func TestCLILeases(t *testing.T) {
	s := startCLITestServer(t)
	te := newCLITestEnv(s.url)
	var ids []uuid.UUID // newest first
	for _, session := range []string{"s-1", "s-2", "s-3"} {
		s.prepareCell(t)
		id, _ := s.claimLease(t, te, session)
		ids = append([]uuid.UUID{id}, ids...)
	}

	if code := te.run("leases"); code != 0 {
		t.Fatalf("leases: exit %d\n%s", code, te.stderr)
	}
	lines := strings.Split(strings.TrimSpace(te.stdout.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "LEASE_ID") || !strings.HasPrefix(lines[1], ids[0].String()) ||
		!strings.Contains(lines[1], "s-3") || !strings.HasPrefix(lines[3], ids[2].String()) || te.stderr.Len() != 0 {
		t.Fatalf("leases:\n%s%s", te.stdout, te.stderr)
	}

	if code := te.run("leases", "--session", "s-2", "--json"); code != 0 {
		t.Fatalf("leases --session: exit %d\n%s", code, te.stderr)
	}
	if r := decodeStdout[wire.LeasesResponse](t, te); !r.OK || len(r.Leases) != 1 || r.Leases[0].LeaseID != ids[1] || r.NextCursor != nil {
		t.Errorf("leases --session s-2 --json = %s", te.stdout)
	}

	// One page, and the hint to the next; then that page.
	if code := te.run("leases", "--limit", "2"); code != 0 || strings.Count(te.stdout.String(), "\n") != 3 {
		t.Fatalf("leases --limit 2: exit %d\n%s%s", code, te.stdout, te.stderr)
	}
	_, cursor, ok := strings.Cut(strings.TrimSpace(te.stderr.String()), "--cursor ")
	cursor, _, _ = strings.Cut(cursor, " ")
	if !ok || cursor == "" {
		t.Fatalf("no cursor hint: %s", te.stderr)
	}
	if code := te.run("leases", "--limit", "2", "--cursor", cursor, "--json"); code != 0 {
		t.Fatalf("leases --cursor: exit %d\n%s", code, te.stderr)
	}
	if r := decodeStdout[wire.LeasesResponse](t, te); len(r.Leases) != 1 || r.Leases[0].LeaseID != ids[2] || r.NextCursor != nil {
		t.Errorf("second page = %s", te.stdout)
	}
	if code := te.run("leases", "--limit", "1", "--all", "--json"); code != 0 {
		t.Fatalf("leases --all: exit %d\n%s", code, te.stderr)
	}
	if r := decodeStdout[wire.LeasesResponse](t, te); len(r.Leases) != 3 || listedIDs(r.Leases)[0] != ids[0] || r.NextCursor != nil {
		t.Errorf("leases --all --json = %s", te.stdout)
	}
	if code := te.run("leases", "--live", "false", "--json"); code != 0 || len(decodeStdout[wire.LeasesResponse](t, te).Leases) != 0 {
		t.Errorf("leases --live false: exit %d\n%s%s", code, te.stdout, te.stderr)
	}

	if code := te.run("leases", "--live", "maybe"); code != 2 {
		t.Errorf("leases --live maybe: exit %d, want 2\n%s", code, te.stderr)
	}
	if code := te.run("leases", "--limit", "5000", "--json"); code != 1 || cliEnvelope(t, te).Code != "invalid_request" {
		t.Errorf("leases --limit 5000: exit %d\n%s", code, te.stdout)
	}
}

func TestCLIRevokeInventoryEvidence(t *testing.T) {
	s := startCLITestServer(t)
	te := newCLITestEnv(s.url)
	s.prepareCell(t)
	s.prepareCell(t)
	workerLease, _ := s.claimLease(t, te, "s-1")

	if code := te.run("inventory", "--json"); code != 0 {
		t.Fatalf("inventory: exit %d\n%s", code, te.stderr)
	}
	inv := decodeStdout[wire.InventoryResponse](t, te)
	if len(inv.Inventory) != 1 || inv.Inventory[0].Ready != 1 || inv.Inventory[0].MaxLeaseSeconds != 300 ||
		strings.Contains(te.stdout.String(), "swrs1_") {
		t.Errorf("inventory --json = %s", te.stdout)
	}
	if code := te.run("inventory"); code != 0 || !strings.Contains(te.stdout.String(), "kata_microvm") {
		t.Errorf("inventory: exit %d\n%s", code, te.stdout)
	}

	// An external worker's cell: quarantined at once, and not live after.
	if code := te.run("revoke", "--lease-id", workerLease.String()); code != 0 ||
		!strings.Contains(te.stdout.String(), "disposition      quarantined") {
		t.Fatalf("revoke: exit %d\n%s%s", code, te.stdout, te.stderr)
	}
	if code := te.run("revoke", "--lease-id", workerLease.String()); code != 1 || !strings.Contains(te.stderr.String(), "conflict: ") {
		t.Errorf("second revoke: exit %d\n%s", code, te.stderr)
	}
	if code := te.run("revoke", "--lease-id", workerLease.String(), "--disposition", "ready"); code != 2 {
		t.Errorf("revoke --disposition ready: exit %d, want 2", code)
	}
	if code := te.run("revoke"); code != 2 || !strings.Contains(te.stderr.String(), "--lease-id") {
		t.Errorf("revoke without --lease-id: exit %d\n%s", code, te.stderr)
	}
	if code := te.run("evidence", "--lease-id", workerLease.String()); code != 1 || !strings.Contains(te.stderr.String(), "not_found: ") {
		t.Errorf("evidence of a worker cell: exit %d\n%s", code, te.stderr)
	}

	// A pool cell (the other worker cell claimed first): revoked, its stop
	// recorded; the holder's release with another disposition is refused.
	s.claimLease(t, te, "s-2")
	cellID := s.addPoolCell(t)
	poolLease, att := s.claimLease(t, te, "s-3")
	if code := te.run("revoke", "--lease-id", poolLease.String(), "--json"); code != 0 {
		t.Fatalf("revoke of a pool lease: exit %d\n%s", code, te.stderr)
	}
	if st := decodeStdout[wire.StatusResponse](t, te).Status; st.CellID != cellID || st.State != lease.Leased {
		t.Errorf("revoke --json = %s", te.stdout)
	}
	release := proofArgs("release", poolLease, att, "--session", "s-3")
	if code := te.run(release...); code != 1 || !strings.Contains(te.stderr.String(), "conflict: ") {
		t.Errorf("release after revoke: exit %d\n%s", code, te.stderr)
	}

	if code := te.run("evidence", "--lease-id", poolLease.String(), "--json"); code != 0 {
		t.Fatalf("evidence: exit %d\n%s", code, te.stderr)
	}
	ev := decodeStdout[wire.EvidenceResponse](t, te).Evidence
	if ev.CellID != cellID || ev.Pool != cliTestPool || ev.Provider == nil || *ev.Provider != "dry-run" || ev.AdmittedAt == nil {
		t.Errorf("evidence --json = %s", te.stdout)
	}
	if code := te.run("evidence", "--lease-id", poolLease.String()); code != 0 ||
		!strings.Contains(te.stdout.String(), "pool              default") || !strings.Contains(te.stdout.String(), "image_digest      null") {
		t.Errorf("evidence: exit %d\n%s", code, te.stdout)
	}
}

// TestCLIRenew: renew extends a live lease (CONTRACT §20) and prints its
// new expiry, or the lease as JSON; it needs --lease-seconds and the lease
// fence, and reports the server's refusals.
func TestCLIRenew(t *testing.T) {
	s := startCLITestServer(t)
	te := newCLITestEnv(s.url)
	s.addPoolCell(t)
	leaseID, att := s.claimLease(t, te, "session-1")
	claimed := time.Now()

	if code := te.run(proofArgs("renew", leaseID, att, "--lease-seconds", "3600", "--json")...); code != 0 {
		t.Fatalf("renew --json: exit %d\n%s%s", code, te.stdout, te.stderr)
	}
	r := decodeStdout[wire.RenewResponse](t, te)
	// 3600 is clamped to the server's maximum lease, 300 s; the claim
	// had the default 120 s.
	if !r.OK || r.Lease.LeaseID != leaseID || !r.Lease.ExpiresAt.After(claimed.Add(200*time.Second)) ||
		r.Lease.ExpiresAt.After(time.Now().Add(301*time.Second)) {
		t.Errorf("renew --json = %s", te.stdout)
	}
	if code := te.run(proofArgs("renew", leaseID, att, "--lease-seconds", "1")...); code != 0 ||
		!strings.Contains(te.stdout.String(), "expires_at     "+cliTime(r.Lease.ExpiresAt)) {
		t.Errorf("renew (never shortens): exit %d\n%s%s", code, te.stdout, te.stderr)
	}
	checkAttestationFile(t, te, att)

	// The fence and the lease: a wrong binding is a conflict, an unknown
	// lease not found.
	if code := te.run(proofArgs("renew", leaseID, att, "--lease-seconds", "60", "--thread", "thread-2")...); code != 1 ||
		!strings.Contains(te.stderr.String(), "sandboxwich renew: conflict: ") {
		t.Errorf("renew with a wrong binding: exit %d\n%s", code, te.stderr)
	}
	if code := te.run(proofArgs("renew", uuid.Must(uuid.NewV7()), att, "--lease-seconds", "60", "--json")...); code != 1 ||
		cliEnvelope(t, te).Code != "not_found" {
		t.Errorf("renew of an unknown lease: exit %d\n%s", code, te.stdout)
	}

	// Usage: --lease-seconds is required, a whole number of at least 1.
	for _, extra := range [][]string{nil, {"--lease-seconds", "0"}, {"--lease-seconds", "-5"}, {"--lease-seconds", "1.5"}} {
		if code := te.run(proofArgs("renew", leaseID, att, extra...)...); code != 2 || !strings.Contains(te.stderr.String(), "lease-seconds") {
			t.Errorf("renew %q: exit %d, want 2\n%s", extra, code, te.stderr)
		}
	}
	if code := te.run("renew", "--lease-seconds", "60"); code != 2 || !strings.Contains(te.stderr.String(), "--lease-id") ||
		!strings.Contains(te.stderr.String(), "--attestation-file") {
		t.Errorf("renew without the fence: exit %d\n%s", code, te.stderr)
	}
}
