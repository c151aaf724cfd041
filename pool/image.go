package pool

import (
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/errcode"
)

// ImageError is a cell whose admitted image is not the one its pool pins
// (CONTRACT §15): code image_digest_unverified, the member stopped and its
// cell quarantined.
type ImageError struct{ Reason string }

func (e *ImageError) Error() string { return string(errcode.ImageDigestUnverified) + ": " + e.Reason }

// VerifyImage compares the image digest a provider read back for a cell
// (obs.ImageDigest) with the digest cfg.Image pins. A pool that pins no
// image checks nothing (its provider's image, if any, is its own
// setting). The plane calls it before every lease operation; the
// reconciler at admission and at every verification.
func VerifyImage(cfg Config, obs driver.Observation) error {
	want := cfg.imageDigest()
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
