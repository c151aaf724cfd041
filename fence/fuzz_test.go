package fence_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/fence"
)

var digestShape = regexp.MustCompile(`\A[A-Za-z0-9_-]{43}\z`)

func fields(r *fence.ClaimRequest) []*string {
	return []*string{&r.ReleaseSetID, &r.RuntimeClass, &r.PolicyDigest, &r.Signature,
		&r.OrganizationID, &r.WorkspaceID, &r.ThreadID, &r.RunnerSessionID}
}

// FuzzClaimDigest checks the claim-request digest of CONTRACT §3.4 on
// arbitrary requests: it is deterministic unpadded base64url of 43
// characters; an omitted lease_seconds differs from every explicit value
// (120 included); two lease_seconds values differ; and, for fields without a
// NUL byte (the only ones the plane lets through), moving a byte across a
// field boundary changes the digest, so two different requests never share
// a fence. Decide then follows the fence-row table of CONTRACT §5 step 1.
func FuzzClaimDigest(f *testing.F) {
	f.Add("release-set-2026-08-07", "kata_microvm", strings.Repeat("a", 64), "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0",
		"org-1", "workspace-1", "thread-1", "session-1", uint64(120), true, uint8(0))
	f.Add("r", "gvisor_lower_risk", strings.Repeat("b", 64), "swrs1_x", "o", "w", "t", "s", uint64(0), false, uint8(3))
	f.Add("", "", "", "", "", "", "", "", uint64(1<<63), true, uint8(7))
	f.Add("a\x00b", "c", "", "", "", "", "", "", uint64(300), true, uint8(1))
	f.Fuzz(func(t *testing.T, rs, rc, pd, sig, org, ws, th, sess string, n uint64, hasN bool, flags uint8) {
		r := fence.ClaimRequest{ReleaseSetID: rs, RuntimeClass: rc, PolicyDigest: pd, Signature: sig,
			OrganizationID: org, WorkspaceID: ws, ThreadID: th, RunnerSessionID: sess}
		if hasN {
			r.LeaseSeconds = &n
		}
		d := fence.Digest(r)
		if !digestShape.MatchString(d) {
			t.Fatalf("digest %q is not 43 characters of unpadded base64url", d)
		}
		if fence.Digest(r) != d {
			t.Fatal("digest is not deterministic")
		}
		other := r
		if hasN {
			other.LeaseSeconds = nil
		} else {
			v := uint64(120)
			other.LeaseSeconds = &v
		}
		if fence.Digest(other) == d {
			t.Fatal("an omitted lease_seconds and an explicit one share a digest")
		}
		if hasN {
			m := n + 1
			other.LeaseSeconds = &m
			if fence.Digest(other) == d {
				t.Fatalf("lease_seconds %d and %d share a digest", n, m)
			}
		}
		nul := false
		for _, p := range fields(&r) {
			nul = nul || strings.ContainsRune(*p, 0)
		}
		if !nul {
			fs := fields(&r)
			for i := 0; i+1 < len(fs); i++ {
				if *fs[i] == "" {
					continue
				}
				shifted := r
				sf := fields(&shifted)
				a := *sf[i]
				*sf[i], *sf[i+1] = a[:len(a)-1], a[len(a)-1:]+*sf[i+1]
				if fence.Digest(shifted) == d {
					t.Fatalf("moving a byte from field %d to %d keeps the digest", i, i+1)
				}
			}
		}

		// Decide: no row → New; a different digest → Conflict whatever the
		// row records; the same digest → the row's outcome.
		if got := fence.Decide(nil, d); got != fence.New {
			t.Fatalf("Decide(nil) = %v", got)
		}
		rec := &fence.Record{Digest: fence.Digest(other), Empty: flags&1 != 0, Live: flags&2 != 0}
		if got := fence.Decide(rec, d); got != fence.Conflict {
			t.Fatalf("Decide with another digest = %v, want conflict", got)
		}
		rec.Digest = d
		want := fence.NoLongerLive
		switch {
		case rec.Empty:
			want = fence.ReplayEmpty
		case rec.Live:
			want = fence.ReplayLease
		}
		if got := fence.Decide(rec, d); got != want {
			t.Fatalf("Decide(%+v) = %v, want %v", *rec, got, want)
		}
	})
}
