package fence_test

import (
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/fence"
)

// Vectors of CONTRACT.md 3.6.
const (
	digest120  = "frCj8Rtydghc-RSdOBKRvPnHJ1MWYOlQQmrt0hLYS4U"
	digestNone = "A9dYExPs8vGsFDnlzbcMlKfhJg-qypdtl-d8KyrGAQw"
)

func seconds(n uint64) *uint64 { return &n }

func vectorRequest(leaseSeconds *uint64) fence.ClaimRequest {
	return fence.ClaimRequest{
		ReleaseSetID:    "release-set-2026-08-07",
		RuntimeClass:    "kata_microvm",
		PolicyDigest:    strings.Repeat("a", 64),
		Signature:       "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0",
		OrganizationID:  "org-1",
		WorkspaceID:     "workspace-1",
		ThreadID:        "thread-1",
		RunnerSessionID: "session-1",
		LeaseSeconds:    leaseSeconds,
	}
}

func TestDigestVectors(t *testing.T) {
	for _, tc := range []struct {
		name         string
		leaseSeconds *uint64
		want         string
	}{
		{"lease_seconds 120", seconds(120), digest120},
		{"lease_seconds omitted", nil, digestNone},
	} {
		if got := fence.Digest(vectorRequest(tc.leaseSeconds)); got != tc.want {
			t.Errorf("%s: Digest = %q, want %q", tc.name, got, tc.want)
		}
	}
}

func TestDigestLeaseSecondsAreRaw(t *testing.T) {
	seen := map[string]string{}
	for _, tc := range []struct {
		name         string
		leaseSeconds *uint64
	}{
		{"omitted", nil},
		{"0", seconds(0)},
		{"1", seconds(1)},
		{"120", seconds(120)},
		{"300", seconds(300)},
		{"1000", seconds(1000)},
		{"max uint64", seconds(^uint64(0))},
	} {
		d := fence.Digest(vectorRequest(tc.leaseSeconds))
		if prev, ok := seen[d]; ok {
			t.Errorf("lease_seconds %s and %s have the same digest %q", prev, tc.name, d)
		}
		seen[d] = tc.name
	}
}

func TestDigestCoversEveryField(t *testing.T) {
	for name, mutate := range map[string]func(*fence.ClaimRequest){
		"ReleaseSetID":    func(r *fence.ClaimRequest) { r.ReleaseSetID = "release-set-2026-08-08" },
		"RuntimeClass":    func(r *fence.ClaimRequest) { r.RuntimeClass = "gvisor_lower_risk" },
		"PolicyDigest":    func(r *fence.ClaimRequest) { r.PolicyDigest = strings.Repeat("b", 64) },
		"Signature":       func(r *fence.ClaimRequest) { r.Signature = "swrs1_l_MSn7I9tFC5tmki9cls8QDtVeI-LlYmNg8IyfrmC0c" },
		"OrganizationID":  func(r *fence.ClaimRequest) { r.OrganizationID = "org-2" },
		"WorkspaceID":     func(r *fence.ClaimRequest) { r.WorkspaceID = "workspace-2" },
		"ThreadID":        func(r *fence.ClaimRequest) { r.ThreadID = "thread-2" },
		"RunnerSessionID": func(r *fence.ClaimRequest) { r.RunnerSessionID = "session-2" },
		"LeaseSeconds":    func(r *fence.ClaimRequest) { r.LeaseSeconds = seconds(121) },
		// Moving a byte across a field boundary changes the message.
		"field boundary": func(r *fence.ClaimRequest) { r.ThreadID, r.RunnerSessionID = "thread-1s", "ession-1" },
	} {
		r := vectorRequest(seconds(120))
		mutate(&r)
		if got := fence.Digest(r); got == digest120 {
			t.Errorf("changing %s does not change the digest", name)
		}
	}
}

func TestDigestDoesNotKeepPointer(t *testing.T) {
	n := uint64(120)
	r := vectorRequest(&n)
	before := fence.Digest(r)
	n = 121
	if after := fence.Digest(r); after == before {
		t.Error("Digest ignores the value LeaseSeconds points to")
	}
}

func TestDecide(t *testing.T) {
	const same, other = digest120, digestNone
	for _, tc := range []struct {
		name string
		rec  *fence.Record
		want fence.Decision
	}{
		{"no row", nil, fence.New},

		{"mismatch, leased live", &fence.Record{Digest: other, Live: true}, fence.Conflict},
		{"mismatch, leased not live", &fence.Record{Digest: other}, fence.Conflict},
		{"mismatch, empty", &fence.Record{Digest: other, Empty: true}, fence.Conflict},
		{"mismatch, empty and live", &fence.Record{Digest: other, Empty: true, Live: true}, fence.Conflict},
		{"mismatch, prefix", &fence.Record{Digest: same[:42], Live: true}, fence.Conflict},
		{"mismatch, case", &fence.Record{Digest: strings.ToUpper(same), Live: true}, fence.Conflict},
		{"mismatch, empty stored digest", &fence.Record{Live: true}, fence.Conflict},

		{"match, leased live", &fence.Record{Digest: same, Live: true}, fence.ReplayLease},
		{"match, leased not live", &fence.Record{Digest: same}, fence.NoLongerLive},
		{"match, empty", &fence.Record{Digest: same, Empty: true}, fence.ReplayEmpty},
		{"match, empty, Live ignored", &fence.Record{Digest: same, Empty: true, Live: true}, fence.ReplayEmpty},
	} {
		if got := fence.Decide(tc.rec, same); got != tc.want {
			t.Errorf("%s: Decide = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestDecisionString(t *testing.T) {
	for d, want := range map[fence.Decision]string{
		fence.New:          "new",
		fence.ReplayLease:  "replay_lease",
		fence.ReplayEmpty:  "replay_empty",
		fence.Conflict:     "conflict",
		fence.NoLongerLive: "no_longer_live",
		fence.Decision(-1): "Decision(-1)",
		fence.Decision(5):  "Decision(5)",
	} {
		if got := d.String(); got != want {
			t.Errorf("Decision(%d).String() = %q, want %q", int(d), got, want)
		}
	}
}

func BenchmarkDigest(b *testing.B) {
	r := vectorRequest(seconds(120))
	b.ReportAllocs()
	for b.Loop() {
		fence.Digest(r)
	}
}
