package sqlite_test

import (
	"database/sql"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/fence"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/store/storetest"
)

func open(tb testing.TB, path string, opts sqlite.Options) *sqlite.Store {
	tb.Helper()
	s, err := sqlite.Open(tb.Context(), path, opts)
	if err != nil {
		tb.Fatalf("Open(%s): %v", path, err)
	}
	return s
}

// newStore opens a fresh database file; the caller closes the store.
func newStore(tb testing.TB) *sqlite.Store {
	tb.Helper()
	return open(tb, filepath.Join(tb.TempDir(), "sandboxwich.db"), sqlite.Options{})
}

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return newStore(t) })
}

// TestNoSecretStored claims a cell with a real lease attestation and checks
// that neither the token, its MAC nor the signing key is in the database.
func TestNoSecretStored(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandboxwich.db")
	s := open(t, path, sqlite.Options{})
	defer s.Close()
	token, digest := claimWithToken(t, s)

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// Positive control: this is the store's database, holding the digest.
	var n int
	if err := db.QueryRow(`SELECT count(*) FROM cells WHERE attestation_digest = ?`, digest).Scan(&n); err != nil || n != 1 {
		t.Fatalf("cells with the attestation digest: %d, %v; want 1", n, err)
	}
	for _, secret := range []string{token, strings.TrimPrefix(token, "swla1_"), testKey} {
		storetest.CheckNoSecret(t, db, secret)
	}
}

const testKey = "sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"

// claimWithToken prepares a cell and claims it with a fenced claim whose
// Sign computes the real attestation; it returns the token and its digest.
func claimWithToken(t *testing.T, s store.Store) (token, digest string) {
	t.Helper()
	ctx := t.Context()
	kr, err := attest.NewKeyring([]byte(testKey))
	if err != nil {
		t.Fatal(err)
	}
	policy := strings.Repeat("a", 64)
	rel := lease.Release{ReleaseSetID: "release-set-2026-08-07", RuntimeClass: lease.KataMicroVM, PolicyDigest: policy,
		Signature: kr.SignRelease("release-set-2026-08-07", string(lease.KataMicroVM), policy)}
	now := time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC)
	if _, err := s.Prepare(ctx, store.PrepareParams{CellID: uuid.Must(uuid.NewV7()), TenantID: "tenant-a",
		WorkerID: "0190f0e0-0000-7000-8000-00000000000a", ProviderCellID: "provider-cell-1", Release: rel,
		ExpiresAt: now.Add(time.Hour), Now: now}); err != nil {
		t.Fatal(err)
	}
	b := lease.Binding{OrganizationID: "org-1", WorkspaceID: "workspace-1", ThreadID: "thread-1", RunnerSessionID: "session-1"}
	ls := uint64(120)
	res, err := s.Claim(ctx, store.ClaimParams{
		TenantID: "tenant-a",
		ClaimID:  uuid.Must(uuid.NewV7()),
		Digest: fence.Digest(fence.ClaimRequest{ReleaseSetID: rel.ReleaseSetID, RuntimeClass: string(rel.RuntimeClass),
			PolicyDigest: rel.PolicyDigest, Signature: rel.Signature, OrganizationID: b.OrganizationID,
			WorkspaceID: b.WorkspaceID, ThreadID: b.ThreadID, RunnerSessionID: b.RunnerSessionID, LeaseSeconds: &ls}),
		Release:      rel,
		Binding:      b,
		LeaseSeconds: ls,
		LeaseID:      uuid.Must(uuid.NewV7()),
		Now:          now,
		Sign: func(l lease.Lease) string {
			token = kr.LeaseToken(attest.LeaseClaims{
				LeaseID: l.ID.String(), CellID: l.CellID.String(), Generation: l.Generation,
				ReleaseSetID: l.Release.ReleaseSetID, RuntimeClass: string(l.Release.RuntimeClass),
				PolicyDigest: l.Release.PolicyDigest, OrganizationID: l.Binding.OrganizationID,
				WorkspaceID: l.Binding.WorkspaceID, ThreadID: l.Binding.ThreadID,
				RunnerSessionID: l.Binding.RunnerSessionID, ExpiresAt: l.ExpiresAt,
				ReleaseSignature: l.Release.Signature,
			})
			return attest.Digest(token)
		},
	})
	if err != nil || res.Lease == nil {
		t.Fatalf("Claim = %+v, %v; want a lease", res, err)
	}
	if !strings.HasPrefix(token, "swla1_") || res.Lease.AttestationDigest != attest.Digest(token) {
		t.Fatalf("token %q does not match the lease digest %q", token, res.Lease.AttestationDigest)
	}
	return token, res.Lease.AttestationDigest
}

// TestMigrateIdempotent opens the same file twice: the second Open migrates
// nothing and keeps the data.
func TestMigrateIdempotent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandboxwich.db")
	s := open(t, path, sqlite.Options{})
	claimWithToken(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = open(t, path, sqlite.Options{})
	defer s.Close()
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after a second Open: %v", err)
	}
	counts, err := s.CellCounts(t.Context())
	if err != nil || counts[lease.Leased] != 1 {
		t.Fatalf("CellCounts after a second Open = %v, %v; want the leased cell", counts, err)
	}
	// And a third, with SkipMigrate, on the migrated file.
	s2 := open(t, path, sqlite.Options{SkipMigrate: true})
	defer s2.Close()
	if err := s2.Ping(t.Context()); err != nil {
		t.Fatalf("Ping with SkipMigrate on a migrated file: %v", err)
	}
}

// TestSkipMigrate opens an empty file without migrating: Ping fails until
// the migrations ran.
func TestSkipMigrate(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sandboxwich.db")
	s := open(t, path, sqlite.Options{SkipMigrate: true})
	defer s.Close()
	if err := s.Ping(t.Context()); err == nil {
		t.Fatal("Ping on an unmigrated file succeeded")
	}
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := sqlite.Migrate(t.Context(), db); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after Migrate: %v", err)
	}
}

func TestOpenEmptyPath(t *testing.T) {
	if s, err := sqlite.Open(t.Context(), "", sqlite.Options{}); err == nil {
		s.Close()
		t.Fatal("Open with an empty path succeeded")
	}
}

func BenchmarkClaim(b *testing.B) {
	s := newStore(b)
	defer s.Close()
	storetest.BenchmarkClaim(b, s)
}

func BenchmarkClaimParallel(b *testing.B) {
	s := newStore(b)
	defer s.Close()
	storetest.BenchmarkClaimParallel(b, s)
}
