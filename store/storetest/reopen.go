package storetest

import (
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// ClaimWithToken prepares a cell in s and claims it with a fenced claim
// whose Sign computes the real attestation; it returns the token and the
// digest the store kept.
func ClaimWithToken(t *testing.T, s store.Store) (token, digest string) {
	t.Helper()
	e := envOver(t, s)
	e.prepare()
	p := e.claimParams(fenced(newID()))
	p.Sign = func(l lease.Lease) string {
		token = e.kr.LeaseToken(attest.ClaimsOf(l))
		return attest.Digest(token)
	}
	res, err := s.Claim(t.Context(), p)
	if err != nil || res.Lease == nil {
		t.Fatalf("Claim = %+v, %v; want a lease", res, err)
	}
	if !strings.HasPrefix(token, "swla1_") || res.Lease.AttestationDigest != attest.Digest(token) {
		t.Fatalf("token %q does not match the lease digest %q", token, res.Lease.AttestationDigest)
	}
	return token, res.Lease.AttestationDigest
}

// CheckReopen opens one database three times through open: the second open
// migrates nothing and keeps the data; the third, without migrating, finds
// the schema current. Closing a store twice succeeds, and a closed store
// fails its calls rather than waiting. The installation identity stays
// the same across all three. open must return a store over the
// same database on every call, migrating it when migrate is true.
func CheckReopen(t *testing.T, open func(t *testing.T, migrate bool) store.Store) {
	t.Helper()
	s := open(t, true)
	installation := installationOf(t, s)
	ClaimWithToken(t, s)
	for i := range 2 {
		if err := s.Close(); err != nil {
			t.Fatalf("Close %d: %v", i+1, err)
		}
	}
	e := envOver(t, s)
	if _, err := s.Prepare(t.Context(), e.prepareParams()); err == nil {
		t.Error("Prepare on a closed store succeeded")
	}
	if _, err := s.Claim(t.Context(), e.claimParams()); err == nil {
		t.Error("Claim on a closed store succeeded")
	}
	s = open(t, true)
	defer s.Close()
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after a second open: %v", err)
	}
	counts, err := s.CellCounts(t.Context())
	if err != nil || counts[lease.Leased] != 1 {
		t.Fatalf("CellCounts after a second open = %v, %v; want the leased cell", counts, err)
	}
	s2 := open(t, false)
	defer s2.Close()
	if err := s2.Ping(t.Context()); err != nil {
		t.Fatalf("Ping without migrating on a migrated database: %v", err)
	}
	for i, s := range []store.Store{s, s2} {
		if got := installationOf(t, s); got != installation {
			t.Errorf("open %d: Installation = %q, want %q as at the first open", i+2, got, installation)
		}
	}
}
