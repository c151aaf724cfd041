package pool_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// noImages is a provider whose cells come from templates (agent-sandbox's
// kind): it cannot make a cell of a requested image.
type noImages struct{ *fake.Provider }

func (p noImages) Capabilities() driver.Capabilities {
	c := p.Provider.Capabilities()
	c.Kind, c.Images = "agent-sandbox", false
	return c
}

// TestImageClassConfigErrors: the settings of an image class that can
// never be served stop start-up, naming the key.
func TestImageClassConfigErrors(t *testing.T) {
	digest := "@sha256:" + strings.Repeat("a", 64)
	for _, tc := range []struct {
		cfg  pool.Config
		want string
	}{
		{pool.Config{Target: 1, Images: []string{"registry.test/swe/*"}, Image: "registry.test/x" + digest}, "image and images"},
		{pool.Config{Target: 2, ReadyFloor: 1, Images: []string{"registry.test/swe/*"}}, "ready_floor"},
		{pool.Config{Target: 2, WarmPerImage: 3, Images: []string{"registry.test/swe/*"}}, "warm_per_image"},
		{pool.Config{Target: 2, Images: []string{"registry.test/swe/*:v1"}}, "images"},
		{pool.Config{Target: 2, Images: []string{"swe"}}, "images"},
		{pool.Config{Target: 2, Images: []string{"registry.test/swe/task" + digest}}, "images"},
		{pool.Config{Target: 2, Images: []string{"registry.test/*/task"}}, "images"},
		{pool.Config{Target: 2, Images: []string{"registry.test/swe/*"}, Provider: noImages{fake.New(fake.Config{})}},
			"the agent-sandbox driver cannot choose a cell's image"},
	} {
		tc.cfg.Name, tc.cfg.TenantID = "p", "acme"
		tc.cfg.Release.RuntimeClass = lease.GVisorLowerRisk
		if tc.cfg.Provider == nil {
			tc.cfg.Provider = fake.New(fake.Config{})
		}
		_, err := pool.New(nil, []pool.Config{tc.cfg})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want one naming %q", tc.cfg.Images, err, tc.want)
		}
	}
}

// TestServes: which claims' images a pool serves — its own image (tag or
// not), or a repository its patterns allow — and which references a claim
// may name at all.
func TestServes(t *testing.T) {
	d := "@sha256:" + strings.Repeat("b", 64)
	class := pool.Config{Images: []string{"registry.test/swe/*", "registry.test/solo"}}
	fixed := pool.Config{Image: "registry.test/base:v1" + d}
	for _, tc := range []struct {
		cfg   pool.Config
		image string
		want  bool
	}{
		{class, "registry.test/swe/task-1" + d, true},
		{class, "registry.test/swe/deep/task-1" + d, true},
		{class, "registry.test/swe" + d, false},
		{class, "registry.test/swex/task-1" + d, false},
		{class, "registry.test/solo" + d, true},
		{class, "registry.test/solo/sub" + d, false},
		{fixed, "registry.test/base" + d, true},
		{fixed, "registry.test/base@sha256:" + strings.Repeat("c", 64), false},
	} {
		image, _, err := pool.CanonicalImage(tc.image)
		if err != nil {
			t.Fatalf("CanonicalImage(%q): %v", tc.image, err)
		}
		if got := tc.cfg.Serves(image); got != tc.want {
			t.Errorf("%v/%q serves %q = %v, want %v", tc.cfg.Images, tc.cfg.Image, tc.image, got, tc.want)
		}
	}
	if got, repo, err := pool.CanonicalImage("registry.test/swe/task-1:v2" + d); err != nil || got != "registry.test/swe/task-1"+d || repo != "registry.test/swe/task-1" {
		t.Errorf("a tag beside the digest: %q %q %v, want it dropped", got, repo, err)
	}
	for _, bad := range []string{"registry.test/swe/task-1:v2", "registry.test/swe/task-1", "", " registry.test/a" + d,
		"registry.test/a@sha256:" + strings.Repeat("B", 64), "registry.test/a@sha512:" + strings.Repeat("b", 128)} {
		if _, _, err := pool.CanonicalImage(bad); !errors.Is(err, errcode.ErrImageNotAllowed) {
			t.Errorf("CanonicalImage(%q): %v, want image_not_allowed", bad, err)
		}
	}
}
