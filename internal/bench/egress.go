package bench

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/lease"
)

// EgressReport is what an egress allow-list costs a gVisor cell (CONTRACT
// §22): provisioning one with an allow-list — its network namespace, veth
// pair and routes on the egress net, its resolver, runsc's sandbox network
// over them — against one without (--network=none).
type EgressReport struct {
	// Allow and None are Provision (created, started, agent answering) of
	// a cell with an allow-list and of one without.
	Allow Stats `json:"allow_list_provision"`
	None  Stats `json:"no_egress_provision"`
	// ProvisionRatio is Allow over None at p50 (target ≤ 1.2).
	ProvisionRatio float64 `json:"provision_ratio"`

	name string // the egress net's, whose namespaces the run removes
}

// benchEgress measures the provision ratio of an allow-list, in turns.
func benchEgress(ctx context.Context, dir string, quick bool) (*EgressReport, error) {
	n := 10
	if quick {
		n = 4
	}
	ectx, cancel := context.WithCancel(ctx)
	defer cancel()
	name := "b" + uuid.NewString()[:8]
	net, err := gvisor.NewEgressNet(ectx, gvisor.EgressConfig{Name: name, StateDir: filepath.Join(dir, "egress-state"),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	defer func() {
		cancel() // Remove waits for the gateway and the making of spares to stop
		_ = net.Remove(context.WithoutCancel(ctx))
	}()
	stateDir := filepath.Join(dir, "runsc-egress-"+uuid.NewString()[:8])
	defer func() { _ = gvisor.RemoveStateDir(stateDir) }()
	base := gvisor.Config{StateDir: stateDir, BundleDir: filepath.Join(dir, "bundles-egress"),
		Installation: driver.InstallationTag(stateDir), Logger: slog.New(slog.DiscardHandler)}
	allowCfg, noneCfg := base, base
	allowCfg.Pool, allowCfg.Egress = "egress-allow", net
	noneCfg.Pool = "egress-none"
	allow, err := gvisor.New(allowCfg)
	if err != nil {
		return nil, err
	}
	none, err := gvisor.New(noneCfg)
	if err != nil {
		return nil, err
	}
	pol, err := egress.Parse([]string{"pypi.org", "files.pythonhosted.org"})
	if err != nil {
		return nil, err
	}
	t, err := inTurns(n, func() (time.Duration, error) {
		d, err := provisionOnce(ctx, allow, pol)
		if err != nil {
			err = fmt.Errorf("provision with an allow-list: %w", err)
		}
		return d, err
	}, func() (time.Duration, error) {
		d, err := provisionOnce(ctx, none, egress.None)
		if err != nil {
			err = fmt.Errorf("provision without egress: %w", err)
		}
		return d, err
	})
	if err != nil {
		return nil, err
	}
	rep := &EgressReport{Allow: summarize(t[0], 0, 0), None: summarize(t[1], 0, 0), name: name}
	rep.ProvisionRatio = ratio(rep.Allow.P50MS, rep.None.P50MS)
	return rep, nil
}

// provisionOnce provisions a cell of p with egress policy pol, timing the
// provision alone, and destroys it.
func provisionOnce(ctx context.Context, p *gvisor.Provider, pol egress.Policy) (time.Duration, error) {
	obj := driver.Object{CellID: uuid.Must(uuid.NewV7())}
	t0 := time.Now()
	_, err := p.Provision(ctx, driver.ProvisionRequest{CellID: obj.CellID, RuntimeClass: lease.GVisorLowerRisk, Egress: pol})
	took := time.Since(t0)
	if derr := p.Destroy(ctx, obj); err == nil {
		err = derr
	}
	return took, err
}
