package sandboxwich

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/store"
)

// egressPools returns the pools a claim that narrows egress may take a cell
// from (CONTRACT §22): the tenant's pools of the release serving the
// claim's image (or, without one, fixed pools) whose policy covers the
// claim's. nil — any pool — for a claim that names no egress or asks for
// none, which every pool covers; errcode.ErrEgressNotAllowed when no pool
// covers it.
func (p *Plane) egressPools(tenantID string, req ClaimRequest, image string) ([]string, error) {
	if req.Egress == nil || req.Egress.IsNone() {
		return nil, nil
	}
	var out []string
	if p.pools != nil {
		for _, name := range p.pools.Names() {
			cfg, _ := p.pools.Pool(name)
			serves := cfg.Serves(image)
			if image == "" {
				serves = !cfg.ImageClass()
			}
			if cfg.TenantID == tenantID && cfg.Release == req.Release && serves && cfg.Egress.Covers(*req.Egress) {
				out = append(out, name)
			}
		}
	}
	if len(out) == 0 {
		return nil, errcode.New(errcode.EgressNotAllowed,
			"no pool of this release allows the egress asked for (a claim may narrow its pool's egress, never widen it)")
	}
	return out, nil
}

// setEgress holds the cell a claim leased to the claim's egress policy
// (CONTRACT §22) before the claimer gets its attestation: the provider of
// a pool with an egress net narrows the cell's policy; a cell whose
// provider enforces no egress has none, which every claim's covers. A
// cell whose policy could not be set is quarantined, and the claim fails
// (its fence then answers a conflict: claim again under a new claim_id).
func (p *Plane) setEgress(ctx context.Context, poolName string, cellID uuid.UUID, pol egress.Policy) error {
	prov := p.provider(poolName) // nil for an external worker's cell: no network
	setter, ok := prov.(driver.EgressEnforcer)
	if !ok || !prov.Capabilities().Egress {
		return nil
	}
	sctx, cancel := context.WithTimeout(ctx, agentTimeout)
	defer cancel()
	err := setter.SetEgress(sctx, driver.Object{CellID: cellID}, pol)
	if err == nil {
		return nil
	}
	m, merr := p.store.Member(ctx, cellID) // only a failure reads the member back
	if merr != nil {
		return errors.Join(err, merr)
	}
	return p.quarantine(ctx, &m, "setting the claim's egress failed", store.ReasonRuntimeUnverified, err,
		errcode.New(errcode.Internal, "the cell's egress could not be set to the claim's; it was quarantined: claim again under a new claim_id"))
}

// EgressHost is how many connections of a lease's cell to one host its
// provider's egress gateway allowed and refused (CONTRACT §22); Host is
// "-" for connections that named no host (an IP literal, a protocol the
// gateway refuses).
type EgressHost struct {
	Host             string
	Allowed, Refused int
}

// EgressCounts returns the connections of a lease's cell by host, sorted
// by host: the provider's counts while it keeps them (a while after the
// cell is destroyed), and none for a cell whose provider enforces no
// egress, which has no network. No path, header, body or query is kept.
// Unknown and foreign leases are errcode.ErrNotFound.
func (p *Plane) EgressCounts(ctx context.Context, tenantID string, leaseID uuid.UUID) ([]EgressHost, error) {
	ev, err := p.store.Evidence(ctx, tenantID, leaseID)
	if err != nil {
		return nil, err
	}
	out := []EgressHost{}
	enf, ok := p.provider(ev.Pool).(driver.EgressEnforcer)
	if !ok {
		return out, nil
	}
	for host, c := range enf.EgressCounts(driver.Object{CellID: ev.CellID}) {
		out = append(out, EgressHost{Host: host, Allowed: c.Allowed, Refused: c.Refused})
	}
	slices.SortFunc(out, func(a, b EgressHost) int { return strings.Compare(a.Host, b.Host) })
	return out, nil
}
