package drivertest

import (
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
)

// TestImage is an image a provider with per-cell images (CONTRACT §21)
// can make a cell of, and a file of it that tells it from the others.
type TestImage struct {
	// Ref is the image, pinned by digest ("host/repo@sha256:<hex>").
	Ref string
	// MarkerPath is a file of the image; Marker is its exact content.
	// "" checks no file (a provider whose cells do not show an image's
	// content, such as the in-memory fake).
	MarkerPath, Marker string
}

// ImageHarness is implemented by the harnesses of providers that report
// driver.Capabilities.Images: Images returns at least two distinct images
// the provider can pull, or nil where the harness's backend runs no image
// (a simulated kubelet): the case is then skipped, and the driver's own
// tests must cover it. A provider that does not report Images needs no
// ImageHarness: the suite checks that it refuses a request naming one.
type ImageHarness interface {
	Images(t *testing.T) []TestImage
}

// testImages is the image-class case: each image's cell admits exactly
// that image (Observation.ImageDigest) and, when commands can run, serves
// its own marker file; a reference not pinned by digest is refused and
// leaves nothing. A provider without per-cell images refuses any.
func (s *suite) testImages(t *testing.T) {
	p := s.provider(t)
	ih, ok := s.h.(ImageHarness)
	if !p.Capabilities().Images {
		cellID := uuid.Must(uuid.NewV7())
		cleanupDestroy(t, p, cellID)
		ref := "registry.invalid/any@sha256:" + strings.Repeat("a", 64)
		if _, err := p.Provision(ctx(t), driver.ProvisionRequest{CellID: cellID, RuntimeClass: s.class, Image: ref}); err == nil {
			t.Fatal("a provider without per-cell images provisioned a cell of a requested image")
		}
		requireAbsent(t, p, driver.Object{CellID: cellID})
		return
	}
	if !ok {
		t.Fatal("the provider reports per-cell images (Capabilities.Images) but the harness is no ImageHarness")
	}
	images := ih.Images(t)
	if images == nil {
		t.Skip("the harness's backend runs no image")
	}
	if len(images) < 2 {
		t.Fatalf("the harness gave %d images, want at least 2", len(images))
	}
	for _, im := range images {
		cellID := uuid.Must(uuid.NewV7())
		cleanupDestroy(t, p, cellID)
		obj, err := p.Provision(ctx(t), driver.ProvisionRequest{CellID: cellID, RuntimeClass: s.class, Image: im.Ref})
		if err != nil {
			t.Fatalf("Provision of image %s: %v", im.Ref, err)
		}
		obs, err := p.Inspect(ctx(t), obj)
		if err != nil {
			t.Fatalf("Inspect: %v", err)
		}
		if want, _ := driver.PinnedDigest(im.Ref); obs.ImageDigest != want {
			t.Errorf("cell of %s admits image digest %q, want %q", im.Ref, obs.ImageDigest, want)
		}
		if err := driver.Verify(obj, obs, s.class); err != nil {
			t.Errorf("cell of %s does not verify: %v", im.Ref, err)
		}
		if im.MarkerPath == "" || !s.canExec(p) {
			continue
		}
		e := s.execer(t, p)
		if res := run(t, e, obj, driver.ExecRequest{Argv: []string{"cat", im.MarkerPath}}); string(res.Stdout) != im.Marker {
			t.Errorf("cell of %s reads %s = %q (exit %d, stderr %q), want %q", im.Ref, im.MarkerPath, res.Stdout, res.ExitCode, res.Stderr, im.Marker)
		}
	}
	ref := images[0].Ref
	for _, bad := range []string{ref[:strings.LastIndexByte(ref, '@')] + ":latest", ref[:strings.LastIndexByte(ref, '@')]} {
		cellID := uuid.Must(uuid.NewV7())
		cleanupDestroy(t, p, cellID)
		if _, err := p.Provision(ctx(t), driver.ProvisionRequest{CellID: cellID, RuntimeClass: s.class, Image: bad}); err == nil {
			t.Errorf("Provision of %q (not pinned by digest) succeeded", bad)
		}
		requireAbsent(t, p, driver.Object{CellID: cellID})
	}
}

// canExec reports whether the suite can run commands in p's cells.
func (s *suite) canExec(p driver.Provider) bool {
	_, execer := p.(driver.Execer)
	_, host := p.(driver.AgentHost)
	return execer || host
}
