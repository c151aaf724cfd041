package dirprovider_test

import (
	"context"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/drivertest"
	"github.com/sandboxwich/sandboxwich/internal/dirprovider"
	"github.com/sandboxwich/sandboxwich/lease"
)

// harness makes providers over one directory, as restarted processes
// would see it.
type harness struct{ dir string }

func (h harness) MakeProvider(context.Context, *testing.T) (driver.Provider, error) {
	return &dirprovider.Provider{Dir: h.dir, MaxLatency: 5 * time.Millisecond}, nil
}
func (harness) RuntimeClass() lease.RuntimeClass { return lease.GVisorLowerRisk }

func TestConformance(t *testing.T) {
	drivertest.Run(t, harness{dir: t.TempDir()})
}
