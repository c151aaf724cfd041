// Package fence implements the claim fence of CONTRACT.md 3.4, section 21's
// fence digest v2 and section 5 step 1: the digest that identifies a fenced
// claim request, and what a retried claim does given the fence row stored
// under its (tenant, claim_id). It imports only package lease of this
// module; the caller computes a claim's canonical egress (package egress).
package fence

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"strconv"

	"github.com/sandboxwich/sandboxwich/lease"
)

const (
	domain   = "sandboxwich-sterile-claim-v1"
	domainV2 = "sandboxwich-sterile-claim-v2"
	none     = "none"
)

// ClaimRequest holds the fields the claim-request digest covers. The tenant
// and the claim ID are the key of the fence row, not part of the digest.
type ClaimRequest struct {
	ReleaseSetID    string
	RuntimeClass    string
	PolicyDigest    string
	Signature       string // the full "swrs1_…" release signature
	OrganizationID  string
	WorkspaceID     string
	ThreadID        string
	RunnerSessionID string
	LeaseSeconds    *uint64 // the raw requested value, before clamping; nil when omitted

	// Image is the claim's image reference exactly as sent (CONTRACT §21),
	// or "" when the claim has none. A valid reference is pinned by digest
	// (it holds "@sha256:"), so it is never the literal "none".
	Image string
	// WaitSeconds is the claim's wait_seconds (CONTRACT §21); 0 when it was
	// absent or 0, which the digest does not tell apart.
	WaitSeconds uint64
	// Egress is nil when the claim has no egress field (absent or null).
	// Otherwise it points to the claim's canonical egress of CONTRACT §22:
	// the canonical host:port lines joined by "\n" — and, unlike the
	// canonical form of a policy, the empty string for an empty list (the
	// claim asked for no egress at all; CONTRACT §21). egress.Policy's
	// FenceString gives exactly this string. It is never "none": every
	// canonical line holds a ':'.
	Egress *string
}

// V2 reports whether r is fenced by digest v2 (CONTRACT §21): it carries an
// image, a wait_seconds above 0 or an egress field. Any other claim keeps
// the v1 digest of 3.4.
func (r ClaimRequest) V2() bool {
	return r.Image != "" || r.WaitSeconds != 0 || r.Egress != nil
}

// Digest returns the claim-request digest: the unpadded base64url SHA-256
// of its message, whose fields are joined by NUL.
//
// A Part I claim ([ClaimRequest.V2] false) has the v1 message of
// CONTRACT.md 3.4, byte for byte: "sandboxwich-sterile-claim-v1", the eight
// strings of r in field order, and LeaseSeconds in decimal or "none" when it
// is nil. An omitted lease_seconds and an explicit 120 (its default) are
// different claims, as are two values that clamp to the same lease.
//
// Any other claim has the v2 message of CONTRACT §21, 13 fields:
// "sandboxwich-sterile-claim-v2", the nine fields that follow the v1
// prefix, then Image or "none" when it is empty, WaitSeconds in decimal or
// "none" when it is 0, and *Egress or "none" when Egress is nil. The two
// prefixes differ, so a v1 and a v2 message never coincide.
//
// Callers validate the fields first (CONTRACT.md section 2; the image as a
// reference pinned by digest, section 15; the egress through package
// egress), so none contains a NUL byte and the message has exactly one
// parse.
func Digest(r ClaimRequest) string {
	v2 := r.V2()
	msg := make([]byte, 0, 384)
	if v2 {
		msg = append(msg, domainV2...)
	} else {
		msg = append(msg, domain...)
	}
	for _, s := range [...]string{
		r.ReleaseSetID, r.RuntimeClass, r.PolicyDigest, r.Signature,
		r.OrganizationID, r.WorkspaceID, r.ThreadID, r.RunnerSessionID,
	} {
		msg = append(append(msg, 0), s...)
	}
	msg = append(msg, 0)
	if r.LeaseSeconds == nil {
		msg = append(msg, none...)
	} else {
		msg = strconv.AppendUint(msg, *r.LeaseSeconds, 10)
	}
	if v2 {
		msg = append(msg, 0)
		if r.Image == "" {
			msg = append(msg, none...)
		} else {
			msg = append(msg, r.Image...)
		}
		msg = append(msg, 0)
		if r.WaitSeconds == 0 {
			msg = append(msg, none...)
		} else {
			msg = strconv.AppendUint(msg, r.WaitSeconds, 10)
		}
		msg = append(msg, 0)
		if r.Egress == nil {
			msg = append(msg, none...)
		} else {
			msg = append(msg, *r.Egress...)
		}
	}
	sum := sha256.Sum256(msg)
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// ClaimRequestOf returns the fields of a claim for release r under binding
// b, with the raw requested lease_seconds (nil when omitted): the one
// mapping from a claim's release and binding to its fence fields. The
// caller sets Image, WaitSeconds and Egress when the claim carries them.
func ClaimRequestOf(r lease.Release, b lease.Binding, leaseSeconds *uint64) ClaimRequest {
	return ClaimRequest{
		ReleaseSetID: r.ReleaseSetID, RuntimeClass: string(r.RuntimeClass), PolicyDigest: r.PolicyDigest,
		Signature: r.Signature, OrganizationID: b.OrganizationID, WorkspaceID: b.WorkspaceID,
		ThreadID: b.ThreadID, RunnerSessionID: b.RunnerSessionID, LeaseSeconds: leaseSeconds,
	}
}

// DigestOf returns the claim-request digest of a Part I claim (no image,
// wait_seconds or egress: the v1 digest) for release r under binding b,
// with the raw requested lease_seconds (nil when omitted). A claim with
// any of the fields of CONTRACT §21 uses Digest of ClaimRequestOf with
// those fields set.
func DigestOf(r lease.Release, b lease.Binding, leaseSeconds *uint64) string {
	return Digest(ClaimRequestOf(r, b, leaseSeconds))
}

// Decision is what a fenced claim does given its fence row.
type Decision int

const (
	// New means there is no fence row: insert it and claim.
	New Decision = iota
	// ReplayLease means the digest matches and the recorded lease is live:
	// return the same lease and its regenerated attestation.
	ReplayLease
	// ReplayEmpty means the digest matches and the attempt that created the
	// row found no cell: return empty, even if inventory exists now.
	ReplayEmpty
	// Conflict means the digest differs (a different release, binding or
	// lease_seconds under the same claim ID): 409 conflict.
	Conflict
	// NoLongerLive means the digest matches but the recorded lease is
	// terminal or expired: 409 conflict, after quarantining the cell if it is
	// still leased. Expired or terminal leases never regenerate authority.
	NoLongerLive
)

var decisionNames = [...]string{
	New:          "new",
	ReplayLease:  "replay_lease",
	ReplayEmpty:  "replay_empty",
	Conflict:     "conflict",
	NoLongerLive: "no_longer_live",
}

// String returns the decision's snake_case name, such as "replay_lease".
func (d Decision) String() string {
	if d >= 0 && int(d) < len(decisionNames) {
		return decisionNames[d]
	}
	return "Decision(" + strconv.Itoa(int(d)) + ")"
}

// Record is what the store found under (tenant, claim_id).
type Record struct {
	// Digest is the claim-request digest the row was created with.
	Digest string
	// Empty reports whether the attempt that created the row found no cell.
	Empty bool
	// Live reports whether the recorded lease's cell is leased and its lease
	// expires after now. It is meaningless when Empty is true.
	Live bool
}

// Decide returns what a fenced claim with digest requestDigest does, given
// the fence row rec, or nil when there is none. The digests are compared in
// constant time, and a mismatch is a Conflict whatever the row recorded.
func Decide(rec *Record, requestDigest string) Decision {
	switch {
	case rec == nil:
		return New
	case subtle.ConstantTimeCompare([]byte(rec.Digest), []byte(requestDigest)) != 1:
		return Conflict
	case rec.Empty:
		return ReplayEmpty
	case rec.Live:
		return ReplayLease
	default:
		return NoLongerLive
	}
}
