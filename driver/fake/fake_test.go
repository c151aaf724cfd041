package fake_test

import (
	"context"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
)

// harness hands out one Provider: its objects live in that value, so a
// "restarted" provider is the same one, as a real provider's restarted
// process sees the same backing state.
type harness struct {
	p     *fake.Provider
	class lease.RuntimeClass
}

func (h harness) MakeProvider(context.Context, *testing.T) (driver.Provider, error) { return h.p, nil }
func (h harness) RuntimeClass() lease.RuntimeClass                                  { return h.class }

// Images are any pinned references: the fake records a cell's image and
// reports its digest; its cells show no content.
func (harness) Images(*testing.T) []drivertest.TestImage { return fakeImages }

var fakeImages = []drivertest.TestImage{
	{Ref: "registry.test/swe/a@sha256:" + strings.Repeat("a", 64)},
	{Ref: "registry.test/swe/b@sha256:" + strings.Repeat("b", 64)},
}

// agentHarness hands out one provider whose objects run the fake agent.
type agentHarness struct{ p *fake.AgentProvider }

func (h agentHarness) MakeProvider(context.Context, *testing.T) (driver.Provider, error) {
	return h.p, nil
}
func (h agentHarness) RuntimeClass() lease.RuntimeClass { return lease.GVisorLowerRisk }

func (agentHarness) Images(*testing.T) []drivertest.TestImage { return fakeImages }

// NoShell: the fake agent runs a few builtins, not `sh -c` scripts.
func (agentHarness) NoShell() {}

// TestConformance proves the fake against the suite every driver passes,
// for both classes it serves and in apply mode too (the mode tests use to
// stand in for a real provider).
func TestConformance(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   fake.Config
		class lease.RuntimeClass
	}{
		{"DryRunGVisor", fake.Config{}, lease.GVisorLowerRisk},
		{"ApplyKata", fake.Config{Mode: driver.Apply, Kind: "fake"}, lease.KataMicroVM},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := fake.New(tc.cfg)
			drivertest.Run(t, harness{p: p, class: tc.class})
			if n := p.Len(); n != 0 {
				t.Errorf("%d objects left after the suite", n)
			}
		})
	}
	t.Run("WithAgent", func(t *testing.T) {
		p := fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"})
		drivertest.Run(t, agentHarness{p: p})
		if n := p.Len(); n != 0 {
			t.Errorf("%d objects left after the suite", n)
		}
	})
}
