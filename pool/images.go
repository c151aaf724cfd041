package pool

import (
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/store"
)

// Defaults of an image class (CONTRACT §21).
const (
	// DefaultWarmPerImage is the most ready cells an image class keeps of
	// each recently claimed image, unless Config.WarmPerImage says.
	DefaultWarmPerImage = 1
	// DefaultWarmIdle is how long an image stays warm after its last
	// claim (or wait), unless Config.WarmIdle says.
	DefaultWarmIdle = 10 * time.Minute
)

// ImageClass reports whether the pool is an image class: its cells are
// made per image, on demand, from the repositories Images allows.
func (c Config) ImageClass() bool { return len(c.Images) > 0 }

// Serves reports whether the pool can serve a claim of image, in the
// canonical form CanonicalImage returns: a fixed pool whose Image is that
// image, or an image class whose Images allow its repository.
func (c Config) Serves(image string) bool {
	if !c.ImageClass() {
		own, _, err := CanonicalImage(c.Image)
		return c.Image != "" && err == nil && own == image
	}
	_, repo, err := CanonicalImage(image)
	if err != nil {
		return false
	}
	for _, p := range c.Images {
		if prefix, ok := strings.CutSuffix(p, "/*"); ok {
			if strings.HasPrefix(repo, prefix+"/") {
				return true
			}
		} else if repo == p {
			return true
		}
	}
	return false
}

// CanonicalImage checks an image reference a claim names (CONTRACT §21):
// "host/repo@sha256:<64 hex>", an explicit registry host, then a
// repository path, pinned by a SHA-256 digest — or it is
// errcode.ErrImageNotAllowed. It returns the reference as cells are made
// of it, "host/repo@sha256:<hex>" (a tag beside the digest is dropped: only
// the digest is ever pulled), and its repository, "host/repo".
func CanonicalImage(ref string) (canonical, repo string, err error) {
	bad := func(why string) (string, string, error) {
		return "", "", errcode.New(errcode.ImageNotAllowed, fmt.Sprintf("image %q %s", ref, why))
	}
	at := strings.LastIndexByte(ref, '@')
	digest, pinned := driver.PinnedDigest(ref)
	if !pinned {
		return bad("must be pinned by digest (host/repo@sha256:<64 lowercase hex digits>): push the image and name it by its digest; a tag names no fixed image")
	}
	repo = ref[:at]
	if slash, colon := strings.LastIndexByte(repo, '/'), strings.LastIndexByte(repo, ':'); colon > slash {
		if !tagRE.MatchString(repo[colon+1:]) {
			return bad("has a malformed tag")
		}
		repo = repo[:colon]
	}
	if !repoRE.MatchString(repo) {
		return bad("must name a registry host and a repository path (host/repo)")
	}
	return repo + "@" + digest, repo, nil
}

// The grammar of a repository with its registry host, and of a tag (the
// distribution reference grammar, with the host required).
var (
	repoRE = regexp.MustCompile(`^` + hostPart + `(?:/` + pathPart + `)+$`)
	tagRE  = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

const (
	hostPart = `(?:localhost|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)+|\[[0-9a-fA-F:]+\])(?::[0-9]+)?`
	pathPart = `[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*`
)

// checkImageClass checks the settings of an image class, naming the key
// at fault.
func (c Config) checkImageClass() error {
	switch {
	case c.Image != "":
		return fmt.Errorf("image and images exclude each other: a pool has one image, or is an image class")
	case c.ReadyFloor != 0:
		return fmt.Errorf("ready_floor is not a setting of an image class")
	case c.WarmPerImage < 1 || (c.Target > 0 && c.WarmPerImage > c.Target):
		return fmt.Errorf("warm_per_image must be between 1 and max_cells")
	case c.WarmIdle < 0:
		return fmt.Errorf("warm_idle_seconds must be positive")
	case c.Provider != nil && !c.Provider.Capabilities().Images:
		return fmt.Errorf("images: the %s driver cannot choose a cell's image (its cells come from templates the plane does not choose)",
			c.Provider.Capabilities().Kind)
	}
	for _, p := range c.Images {
		// A repository ("host/repo") or every one under a prefix
		// ("host/prefix/*").
		if !repoRE.MatchString(strings.TrimSuffix(p, "/*")) {
			return fmt.Errorf("images: %q must be host/repo or host/prefix/* (a registry host, then a path)", p)
		}
	}
	return nil
}

// cellImage is the image m's cell runs, as its cell records it: the
// member's own, or the fixed pool's (canonical); "" when neither pins one.
func (c Config) cellImage(m store.Member) string {
	if m.Image != "" {
		return m.Image
	}
	own, _, err := CanonicalImage(c.Image)
	if err != nil {
		return ""
	}
	return own
}
