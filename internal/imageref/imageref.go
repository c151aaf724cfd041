// Package imageref parses the image reference a pool pins (CONTRACT §15):
// an OCI reference pinned by a SHA-256 digest, "host/repo@sha256:<64 hex>"
// or "host/repo:tag@sha256:<64 hex>". It checks syntax only; the registry
// and media types are checked when the image is pulled.
package imageref

import (
	"fmt"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Error is a reference that is not pinned by digest, or malformed. Its
// message names the reference and the rule, never a credential (a
// reference holds none).
type Error struct {
	Ref    string
	Reason string
}

func (e *Error) Error() string {
	return fmt.Sprintf("image %q %s", e.Ref, e.Reason)
}

// Parse returns ref as a digest reference. A reference with a tag and no
// digest, any digest but SHA-256, or a malformed reference is an *Error.
// The tag of "repo:tag@sha256:…" is kept for display only: the digest is
// what is pulled, never the tag.
func Parse(ref string) (name.Digest, error) {
	if strings.TrimSpace(ref) != ref || ref == "" {
		return name.Digest{}, &Error{Ref: ref, Reason: "must be a non-empty reference without surrounding spaces"}
	}
	if !strings.Contains(ref, "@") {
		return name.Digest{}, &Error{Ref: ref, Reason: "must be pinned by digest (host/repo@sha256:<64 hex digits>): a tag alone names no fixed image"}
	}
	d, err := name.NewDigest(ref, name.StrictValidation)
	if err != nil {
		return name.Digest{}, &Error{Ref: ref, Reason: "is not a valid reference pinned by digest: " + err.Error()}
	}
	hexPart, ok := strings.CutPrefix(d.DigestStr(), "sha256:")
	if !ok || len(hexPart) != 64 || strings.Trim(hexPart, "0123456789abcdef") != "" {
		return name.Digest{}, &Error{Ref: ref, Reason: "must be pinned by a SHA-256 digest (sha256:<64 lowercase hex digits>)"}
	}
	return d, nil
}
