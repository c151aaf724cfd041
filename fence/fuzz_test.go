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

// FuzzClaimDigest checks the claim-request digest of CONTRACT §3.4 and
// §21 on arbitrary requests: it is deterministic unpadded base64url of 43
// characters; an omitted lease_seconds differs from every explicit value
// (120 included); two lease_seconds values differ; and, for fields without a
// NUL byte (the only ones the plane lets through), moving a byte across a
// field boundary changes the digest, so two different requests never share
// a fence. A claim without image, wait_seconds or egress has the v1 digest;
// any other has a v2 digest, never equal to the v1 digest of the same
// inputs, and changed by each of its own fields (no image vs an image, two
// wait_seconds, no egress vs an egress string, the empty one included).
// Decide then follows the fence-row table of CONTRACT §5 step 1.
func FuzzClaimDigest(f *testing.F) {
	f.Add("release-set-2026-08-07", "kata_microvm", strings.Repeat("a", 64), "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0",
		"org-1", "workspace-1", "thread-1", "session-1", uint64(120), true, uint8(0), "", uint64(0), "", false)
	f.Add("r", "gvisor_lower_risk", strings.Repeat("b", 64), "swrs1_x", "o", "w", "t", "s", uint64(0), false, uint8(3),
		"", uint64(0), "", false)
	f.Add("", "", "", "", "", "", "", "", uint64(1<<63), true, uint8(7), "", uint64(0), "", false)
	f.Add("a\x00b", "c", "", "", "", "", "", "", uint64(300), true, uint8(1), "", uint64(0), "", false)
	f.Add("release-set-2026-08-07", "kata_microvm", strings.Repeat("a", 64), "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0",
		"org-1", "workspace-1", "thread-1", "session-1", uint64(120), true, uint8(2),
		"registry.test/swe/task-1@sha256:"+strings.Repeat("b", 64), uint64(60), "*.files.test:8443\npkgs.test:443\npkgs.test:80", true)
	f.Add("r", "c", "p", "s", "o", "w", "t", "s", uint64(0), false, uint8(0), "", uint64(0), "", true)
	f.Add("r", "c", "p", "s", "o", "w", "t", "s", uint64(0), false, uint8(0), "", uint64(1<<64-1), "", false)
	f.Fuzz(func(t *testing.T, rs, rc, pd, sig, org, ws, th, sess string, n uint64, hasN bool, flags uint8,
		image string, wait uint64, eg string, hasEgress bool) {
		r := fence.ClaimRequest{ReleaseSetID: rs, RuntimeClass: rc, PolicyDigest: pd, Signature: sig,
			OrganizationID: org, WorkspaceID: ws, ThreadID: th, RunnerSessionID: sess,
			Image: image, WaitSeconds: wait}
		if hasN {
			r.LeaseSeconds = &n
		}
		if hasEgress {
			r.Egress = &eg
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
		checkV2(t, r, d)

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

// checkV2 checks the choice between the v1 and the v2 digest for r, whose
// digest is d, and that each field of v2 changes the digest. "none" is not
// a valid image (it has no digest) nor a canonical egress (its lines hold a
// ':'), so the checks that would confuse them with an absent field skip it.
func checkV2(t *testing.T, r fence.ClaimRequest, d string) {
	t.Helper()
	v2 := r.Image != "" || r.WaitSeconds != 0 || r.Egress != nil
	if r.V2() != v2 {
		t.Fatalf("V2 = %v for image %q, wait_seconds %d, egress %v", r.V2(), r.Image, r.WaitSeconds, r.Egress != nil)
	}
	v1 := r
	v1.Image, v1.WaitSeconds, v1.Egress = "", 0, nil
	if (fence.Digest(v1) == d) == v2 {
		t.Fatalf("V2 %v: the digest is %q, the v1 digest of the same inputs %q", v2, d, fence.Digest(v1))
	}
	other := r
	other.WaitSeconds++
	if other.WaitSeconds != 0 && fence.Digest(other) == d {
		t.Fatalf("wait_seconds %d and %d share a digest", r.WaitSeconds, other.WaitSeconds)
	}
	if r.Image != "none" {
		other = r
		if r.Image == "" {
			other.Image = "registry.test/i@sha256:" + strings.Repeat("c", 64)
		} else {
			other.Image = ""
		}
		if fence.Digest(other) == d {
			t.Fatalf("image %q and %q share a digest", r.Image, other.Image)
		}
	}
	if r.Egress == nil || *r.Egress != "none" {
		other = r
		if r.Egress == nil {
			empty := ""
			other.Egress = &empty
		} else {
			other.Egress = nil
		}
		if fence.Digest(other) == d {
			t.Fatalf("egress %v and %v share a digest", r.Egress != nil, other.Egress != nil)
		}
	}
}
