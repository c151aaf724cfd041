package fence_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/fence"
	"github.com/sandboxwich/sandboxwich/lease"
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
		"Image":           func(r *fence.ClaimRequest) { r.Image = vectorImage },
		"WaitSeconds":     func(r *fence.ClaimRequest) { r.WaitSeconds = 1 },
		"Egress":          func(r *fence.ClaimRequest) { r.Egress = new("") },
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

// The fence digest v2 vectors of CONTRACT §21: the inputs of 3.6, kata
// release, this image, and the claim egress ["PKGS.test.",
// "*.files.test:8443"] in its canonical form.
var (
	vectorImage  = "registry.test/swe/task-1@sha256:" + strings.Repeat("b", 64)
	vectorEgress = []string{"PKGS.test.", "*.files.test:8443"}
)

const (
	digestV2Image        = "6nE1neE4Ajp_YVqqnkSGRmVT68yPfp9At06din-N7XA"
	digestV2ImageWaitEgr = "CiF-izpnZHmzHlLSbsiJkKz0vRrhx01EA9uUtAOQSkQ"
	digestV2EgressOnly   = "CHZWI4uXRqx-KUZz8N8F8-VxoIP9v55JrkC5vgdEOyQ"
)

func vectorEgressCanonical(t *testing.T) *string {
	t.Helper()
	p, err := egress.Parse(vectorEgress)
	if err != nil {
		t.Fatal(err)
	}
	s := p.FenceString()
	return &s
}

func TestDigestV2Vectors(t *testing.T) {
	eg := vectorEgressCanonical(t)
	if *eg != "*.files.test:8443\npkgs.test:443\npkgs.test:80" {
		t.Fatalf("canonical egress %q", *eg)
	}
	for _, tc := range []struct {
		name string
		r    fence.ClaimRequest
		want string
	}{
		{"lease_seconds 120, image", func() fence.ClaimRequest {
			r := vectorRequest(seconds(120))
			r.Image = vectorImage
			return r
		}(), digestV2Image},
		{"lease_seconds 120, image, wait_seconds 60, egress", func() fence.ClaimRequest {
			r := vectorRequest(seconds(120))
			r.Image, r.WaitSeconds, r.Egress = vectorImage, 60, eg
			return r
		}(), digestV2ImageWaitEgr},
		{"lease_seconds omitted, egress only", func() fence.ClaimRequest {
			r := vectorRequest(nil)
			r.Egress = eg
			return r
		}(), digestV2EgressOnly},
	} {
		if !tc.r.V2() {
			t.Errorf("%s: V2 is false", tc.name)
		}
		if got := fence.Digest(tc.r); got != tc.want {
			t.Errorf("%s: Digest = %q, want %q", tc.name, got, tc.want)
		}
	}
}

// TestDigestV1Unchanged: a claim without image, with wait_seconds 0 and
// without egress keeps the v1 digest of 3.4 byte for byte, through Digest,
// ClaimRequestOf and DigestOf alike.
func TestDigestV1Unchanged(t *testing.T) {
	for _, tc := range []struct {
		leaseSeconds *uint64
		want         string
	}{{seconds(120), digest120}, {nil, digestNone}} {
		r := vectorRequest(tc.leaseSeconds)
		r.WaitSeconds = 0
		if r.V2() {
			t.Error("V2 of a Part I claim")
		}
		if got := fence.Digest(r); got != tc.want {
			t.Errorf("Digest = %q, want %q", got, tc.want)
		}
		rel := lease.Release{ReleaseSetID: r.ReleaseSetID, RuntimeClass: lease.RuntimeClass(r.RuntimeClass),
			PolicyDigest: r.PolicyDigest, Signature: r.Signature}
		b := lease.Binding{OrganizationID: r.OrganizationID, WorkspaceID: r.WorkspaceID,
			ThreadID: r.ThreadID, RunnerSessionID: r.RunnerSessionID}
		if got := fence.ClaimRequestOf(rel, b, tc.leaseSeconds); !reflect.DeepEqual(got, r) {
			t.Errorf("ClaimRequestOf = %+v, want %+v", got, r)
		}
		if got := fence.DigestOf(rel, b, tc.leaseSeconds); got != tc.want {
			t.Errorf("DigestOf = %q, want %q", got, tc.want)
		}
	}
}

// TestDigestV2Fields: each v2 field alone makes a v2 digest, different from
// the v1 digest of the same inputs and from every other such claim; the
// "none" spellings are the absent values (wait_seconds 0, no egress), and
// an empty egress list ("") is not the absence of egress ("none").
func TestDigestV2Fields(t *testing.T) {
	empty, eg := "", vectorEgressCanonical(t)
	seen := map[string]string{}
	for _, ls := range []*uint64{nil, seconds(120)} {
		for _, tc := range []struct {
			name   string
			mutate func(*fence.ClaimRequest)
		}{
			{"v1", func(*fence.ClaimRequest) {}},
			{"image", func(r *fence.ClaimRequest) { r.Image = vectorImage }},
			{"other image", func(r *fence.ClaimRequest) { r.Image = vectorImage[:len(vectorImage)-1] + "c" }},
			{"wait 1", func(r *fence.ClaimRequest) { r.WaitSeconds = 1 }},
			{"wait 60", func(r *fence.ClaimRequest) { r.WaitSeconds = 60 }},
			{"wait 300", func(r *fence.ClaimRequest) { r.WaitSeconds = 300 }},
			{"egress empty list", func(r *fence.ClaimRequest) { r.Egress = &empty }},
			{"egress", func(r *fence.ClaimRequest) { r.Egress = eg }},
			{"image, egress empty list", func(r *fence.ClaimRequest) { r.Image, r.Egress = vectorImage, &empty }},
			{"image, wait 60", func(r *fence.ClaimRequest) { r.Image, r.WaitSeconds = vectorImage, 60 }},
			{"all", func(r *fence.ClaimRequest) { r.Image, r.WaitSeconds, r.Egress = vectorImage, 60, eg }},
		} {
			r := vectorRequest(ls)
			tc.mutate(&r)
			name := fmt.Sprintf("%s (lease_seconds %v)", tc.name, ls != nil)
			if r.V2() != (tc.name != "v1") {
				t.Errorf("%s: V2 = %v", name, r.V2())
			}
			d := fence.Digest(r)
			if prev, ok := seen[d]; ok {
				t.Errorf("%s and %s have the same digest %q", prev, name, d)
			}
			seen[d] = name
		}
	}
}

func TestDigestV2DoesNotKeepPointer(t *testing.T) {
	s := "pkgs.test:443"
	r := vectorRequest(nil)
	r.Egress = &s
	before := fence.Digest(r)
	s = "pkgs.test:80"
	if after := fence.Digest(r); after == before {
		t.Error("Digest ignores the value Egress points to")
	}
}
