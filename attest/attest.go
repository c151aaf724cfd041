// Package attest signs and verifies the sterile-cell trust tokens of
// CONTRACT.md section 3: release signatures ("swrs1_…"), lease attestations
// ("swla1_…"), their persisted digests and the canonical timestamps that go
// inside the MACs.
//
// All MACs are HMAC-SHA256 over fields joined by a NUL byte. Callers validate
// the fields first (CONTRACT.md section 2), so no field contains a NUL byte
// and every message has exactly one parse.
//
// It imports only package lease of this module ([ClaimsOf]).
package attest

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"hash"
	"strconv"
	"sync"
	"time"

	"github.com/sandboxwich/sandboxwich/lease"
)

const (
	releaseDomain = "sandboxwich-sterile-release-v1"
	leaseDomain   = "sandboxwich-sterile-lease-v1"

	releasePrefix = "swrs1_"
	leasePrefix   = "swla1_"
)

// Keyring holds the HMAC-SHA256 signing key. It holds one active key for now;
// key rotation can add key IDs later without changing the token formats for
// the active key.
//
// A Keyring is safe for concurrent use. The zero value is not usable: create
// one with [NewKeyring] or [LoadKeyFile].
type Keyring struct {
	key  []byte
	macs sync.Pool // of hash.Hash: HMAC-SHA256 under key
}

// NewKeyring returns a Keyring for a copy of key, which must be 32 to 4096
// bytes long. Otherwise it returns an error wrapping [ErrKeyTooShort] or
// [ErrKeyTooLong].
func NewKeyring(key []byte) (*Keyring, error) {
	switch {
	case len(key) < minKeySize:
		return nil, fmt.Errorf("%w: got %d bytes", ErrKeyTooShort, len(key))
	case len(key) > maxKeySize:
		return nil, fmt.Errorf("%w: got %d bytes", ErrKeyTooLong, len(key))
	}
	k := &Keyring{key: append([]byte(nil), key...)}
	k.macs.New = func() any { return hmac.New(sha256.New, k.key) }
	return k, nil
}

const redacted = "attest.Keyring{REDACTED}"

// String returns a fixed text, so that printing a Keyring never shows the key.
func (*Keyring) String() string { return redacted }

// GoString is like String, for the %#v verb.
func (*Keyring) GoString() string { return redacted }

// SignRelease returns the signature of r's trust class, CONTRACT.md 3.2:
// "swrs1_" followed by the unpadded base64url HMAC of
// "sandboxwich-sterile-release-v1" NUL release_set_id NUL runtime_class NUL
// policy_digest. r.Signature is not read.
func (k *Keyring) SignRelease(r lease.Release) string {
	msg := make([]byte, 0, len(releaseDomain)+len(r.ReleaseSetID)+len(r.RuntimeClass)+len(r.PolicyDigest)+3)
	msg = append(msg, releaseDomain...)
	msg = appendField(msg, r.ReleaseSetID)
	msg = appendField(msg, string(r.RuntimeClass))
	msg = appendField(msg, r.PolicyDigest)
	return k.token(releasePrefix, msg)
}

// VerifyRelease reports whether r.Signature is the signature of r's trust
// class. It compares the whole wire string in constant time.
func (k *Keyring) VerifyRelease(r lease.Release) bool {
	return EqualDigest(k.SignRelease(r), r.Signature)
}

// LeaseClaims are the 12 variable fields of a lease attestation, in message
// order.
type LeaseClaims struct {
	LeaseID          string // lowercase hyphenated UUID, used as given
	CellID           string // lowercase hyphenated UUID, used as given
	Generation       uint64
	ReleaseSetID     string
	RuntimeClass     string
	PolicyDigest     string
	OrganizationID   string
	WorkspaceID      string
	ThreadID         string
	RunnerSessionID  string
	ExpiresAt        time.Time // formatted with CanonicalTime
	ReleaseSignature string    // the full "swrs1_…" string
}

// ClaimsOf returns the attestation claims of a lease: the one mapping from
// a lease to the fields its attestation signs.
//
// The expiry it covers is the one the claim granted (l.GrantedExpiresAt,
// or l.ExpiresAt when that is unset): a renewal moves a lease's expiry but
// never its attestation (CONTRACT §20).
func ClaimsOf(l lease.Lease) LeaseClaims {
	return LeaseClaims{
		LeaseID:          l.ID.String(),
		CellID:           l.CellID.String(),
		Generation:       l.Generation,
		ReleaseSetID:     l.Release.ReleaseSetID,
		RuntimeClass:     string(l.Release.RuntimeClass),
		PolicyDigest:     l.Release.PolicyDigest,
		OrganizationID:   l.Binding.OrganizationID,
		WorkspaceID:      l.Binding.WorkspaceID,
		ThreadID:         l.Binding.ThreadID,
		RunnerSessionID:  l.Binding.RunnerSessionID,
		ExpiresAt:        granted(l),
		ReleaseSignature: l.Release.Signature,
	}
}

// LeaseToken returns the lease attestation of CONTRACT.md 3.3: "swla1_"
// followed by the unpadded base64url HMAC of "sandboxwich-sterile-lease-v1"
// and the fields of c, joined by NUL, with the generation in decimal and the
// expiry formatted by [CanonicalTime]. The token is a pure function of c and
// the key; persist only its [Digest].
func (k *Keyring) LeaseToken(c LeaseClaims) string {
	msg := make([]byte, 0, 512)
	msg = append(msg, leaseDomain...)
	msg = appendField(msg, c.LeaseID)
	msg = appendField(msg, c.CellID)
	msg = strconv.AppendUint(append(msg, 0), c.Generation, 10)
	msg = appendField(msg, c.ReleaseSetID)
	msg = appendField(msg, c.RuntimeClass)
	msg = appendField(msg, c.PolicyDigest)
	msg = appendField(msg, c.OrganizationID)
	msg = appendField(msg, c.WorkspaceID)
	msg = appendField(msg, c.ThreadID)
	msg = appendField(msg, c.RunnerSessionID)
	msg = appendTime(append(msg, 0), c.ExpiresAt, "+00:00")
	msg = appendField(msg, c.ReleaseSignature)
	return k.token(leasePrefix, msg)
}

// token returns prefix followed by the unpadded base64url HMAC-SHA256 of msg.
func (k *Keyring) token(prefix string, msg []byte) string {
	if len(k.key) == 0 {
		panic("attest: use of a zero Keyring; create it with NewKeyring or LoadKeyFile")
	}
	mac := k.macs.Get().(hash.Hash)
	mac.Write(msg)
	var sum [sha256.Size]byte
	mac.Sum(sum[:0])
	mac.Reset()
	k.macs.Put(mac)
	enc := base64.RawURLEncoding
	out := make([]byte, len(prefix)+enc.EncodedLen(sha256.Size))
	copy(out, prefix)
	enc.Encode(out[len(prefix):], sum[:])
	return string(out)
}

// appendField appends a NUL separator and s to msg.
func appendField(msg []byte, s string) []byte {
	return append(append(msg, 0), s...)
}

// Digest returns the lowercase hex SHA-256 of token: the only form of a lease
// attestation that is persisted.
func Digest(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// EqualDigest reports whether a and b are equal, in time that depends only on
// their lengths.
func EqualDigest(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// CanonicalTime formats t as the canonical timestamp of CONTRACT.md 3.5, used
// inside MACs and in storage: t in UTC as "2006-01-02T15:04:05", a fraction of
// exactly 0, 3, 6 or 9 digits (the shortest of those that is exact), and
// "+00:00". For example "2026-08-07T12:00:00.100+00:00".
func CanonicalTime(t time.Time) string {
	return string(appendTime(make([]byte, 0, 35), t, "+00:00"))
}

// WireTime formats t like [CanonicalTime] but with the suffix "Z", as in
// response bodies (CONTRACT.md section 1). For example "2026-08-07T12:00:00Z".
func WireTime(t time.Time) string {
	return string(appendTime(make([]byte, 0, 30), t, "Z"))
}

// appendTime appends t in UTC with the shortest exact fraction of 0, 3, 6 or
// 9 digits, followed by zone.
func appendTime(b []byte, t time.Time, zone string) []byte {
	const layout = "2006-01-02T15:04:05"
	t = t.UTC()
	switch ns := t.Nanosecond(); {
	case ns == 0:
		b = t.AppendFormat(b, layout)
	case ns%1e6 == 0:
		b = t.AppendFormat(b, layout+".000")
	case ns%1e3 == 0:
		b = t.AppendFormat(b, layout+".000000")
	default:
		b = t.AppendFormat(b, layout+".000000000")
	}
	return append(b, zone...)
}

// granted is the expiry the claim granted l.
func granted(l lease.Lease) time.Time {
	if l.GrantedExpiresAt.IsZero() {
		return l.ExpiresAt
	}
	return l.GrantedExpiresAt
}
