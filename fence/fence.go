// Package fence implements the claim fence of CONTRACT.md 3.4 and section 5
// step 1: the digest that identifies a fenced claim request, and what a
// retried claim does given the fence row stored under its (tenant, claim_id).
// It imports only package lease of this module.
package fence

import (
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"strconv"

	"github.com/sandboxwich/sandboxwich/lease"
)

const domain = "sandboxwich-sterile-claim-v1"

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
}

// Digest returns the claim-request digest of CONTRACT.md 3.4: the unpadded
// base64url SHA-256 of "sandboxwich-sterile-claim-v1", the eight strings of r
// in field order, and LeaseSeconds in decimal or "none" when it is nil, joined
// by NUL. An omitted lease_seconds and an explicit 120 (its default) are
// different claims, as are two values that clamp to the same lease.
//
// Callers validate the fields first (CONTRACT.md section 2), so none contains
// a NUL byte and the message has exactly one parse.
func Digest(r ClaimRequest) string {
	msg := make([]byte, 0, 256)
	msg = append(msg, domain...)
	for _, s := range [...]string{
		r.ReleaseSetID, r.RuntimeClass, r.PolicyDigest, r.Signature,
		r.OrganizationID, r.WorkspaceID, r.ThreadID, r.RunnerSessionID,
	} {
		msg = append(append(msg, 0), s...)
	}
	msg = append(msg, 0)
	if r.LeaseSeconds == nil {
		msg = append(msg, "none"...)
	} else {
		msg = strconv.AppendUint(msg, *r.LeaseSeconds, 10)
	}
	sum := sha256.Sum256(msg)
	return base64.RawURLEncoding.EncodeToString(sum[:])
}

// DigestOf returns the claim-request digest of a claim for release r under
// binding b, with the raw requested lease_seconds (nil when omitted): the
// one mapping from a claim to the fields its fence covers.
func DigestOf(r lease.Release, b lease.Binding, leaseSeconds *uint64) string {
	return Digest(ClaimRequest{
		ReleaseSetID: r.ReleaseSetID, RuntimeClass: string(r.RuntimeClass), PolicyDigest: r.PolicyDigest,
		Signature: r.Signature, OrganizationID: b.OrganizationID, WorkspaceID: b.WorkspaceID,
		ThreadID: b.ThreadID, RunnerSessionID: b.RunnerSessionID, LeaseSeconds: leaseSeconds,
	})
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
