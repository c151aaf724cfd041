package pool

import (
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/store"
)

// ImageError is a cell whose admitted image is not the one its pool pins
// (CONTRACT §15): code image_digest_unverified, the member stopped and its
// cell quarantined.
type ImageError struct{ Reason string }

func (e *ImageError) Error() string { return string(errcode.ImageDigestUnverified) + ": " + e.Reason }

// VerifyImage compares the image digest a provider read back for member
// m's cell (obs.ImageDigest) with the digest its image is pinned by: the
// member's own (an image class's) or cfg.Image. A fixed pool that pins no
// image checks nothing (its provider's image, if any, is its own
// setting). The plane calls it before every lease operation; the
// reconciler at admission and at every verification.
func VerifyImage(cfg Config, m store.Member, obs driver.Observation) error {
	want := cfg.imageDigest()
	if m.Image != "" {
		want, _ = driver.PinnedDigest(m.Image)
	}
	switch {
	case want == "":
		return nil
	case obs.ImageDigest == "":
		return &ImageError{Reason: "the provider reports no admitted image digest"}
	case obs.ImageDigest != want:
		return &ImageError{Reason: "the admitted image digest is not the pool's pinned digest"}
	}
	return nil
}
