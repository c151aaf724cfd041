package lease

import (
	"crypto/subtle"
	"errors"
	"time"
)

// Proof is what a tenant presents to act on a lease: the lease fence.
type Proof struct {
	Generation        uint64
	Binding           Binding
	AttestationDigest string // SHA-256 hex of the presented attestation
}

// Lease-fence outcomes (CONTRACT §6). Both are conflicts on the wire.
var (
	// ErrFenceMismatch: generation, binding or attestation differ from the
	// stored lease. Nothing changes.
	ErrFenceMismatch = errors.New("does not match the live lease fence")
	// ErrNotLive: the fence matches but the lease is terminal or expired.
	ErrNotLive = errors.New("lease is no longer live")
)

// CheckProof applies the lease fence to a cell that holds the lease: p must
// match the stored generation, binding and attestation digest (compared in
// constant time), and the lease must be live at now.
func (c *Cell) CheckProof(p Proof, now time.Time) error {
	l := c.Lease
	if l == nil {
		return ErrFenceMismatch
	}
	match := p.Generation == c.Generation &&
		p.Binding == l.Binding &&
		subtle.ConstantTimeCompare([]byte(p.AttestationDigest), []byte(l.AttestationDigest)) == 1
	if !match {
		return ErrFenceMismatch
	}
	if !c.LeaseLive(now) {
		return ErrNotLive
	}
	return nil
}
