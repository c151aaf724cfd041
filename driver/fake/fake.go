// Package fake is an in-memory provider with fault injection, for tests,
// examples and the reference binary's clearly labelled `dry-run` provider.
//
// It simulates the whole life cycle: Provision records an object, Inspect
// reports it admitted under the requested runtime class, Destroy removes it
// and proves it gone. Its mode is driver.DryRun unless told otherwise, and a
// dry-run result is never evidence that a runtime existed.
//
// Faults are injected by probability (Faults) or per cell (Drift, Vanish),
// so tests can produce what a real provider does only on a bad day:
// failed provisions, destroys that time out or cannot be confirmed,
// responses lost after the provider acted, and runtime-class drift.
//
// [NewWithAgent] returns the same provider whose objects run an in-memory
// cell agent (driver.AgentHost), with faults of its own (AgentFaults). A
// provider from [New] has no agent and no exec: the plane answers its
// lease operations with exec_unsupported.
package fake

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/internal/ctxsleep"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Faults are probabilities in [0, 1] of each injected failure.
type Faults struct {
	// ProvisionFailure fails a provision before anything is created.
	ProvisionFailure float64
	// DestroyUncertain returns an uncertain result without deleting.
	DestroyUncertain float64
	// DestroyTimeout blocks a destroy until its context ends.
	DestroyTimeout float64
	// LostResponse performs a provision or destroy and then reports an
	// error, as if the response was lost on the way back.
	LostResponse float64
	// SetEgress fails every SetEgress (the plane must then quarantine the
	// cell rather than hand out a lease held to a wider policy).
	SetEgress bool
}

// Config configures a Provider. The zero value is a dry-run provider with
// no latency and no faults.
type Config struct {
	// Mode defaults to driver.DryRun.
	Mode driver.Mode
	// Kind defaults to "dry-run".
	Kind string
	// Latency delays every provision and destroy.
	Latency time.Duration
	Faults  Faults
	// Seed makes fault injection reproducible.
	Seed uint64
	// Now is the agents' clock, by which an activation expires (default
	// time.Now).
	Now func() time.Time
	// Image is the image, pinned by digest, of an object provisioned
	// without one (as a fixed pool's Image): what Inspect reports as
	// admitted. "" reports none.
	Image string
	// Egress makes the provider report Capabilities.Egress, so that a
	// pool with an egress allow-list takes it (tests of the plane's
	// side of CONTRACT §22). Its objects carry no traffic at all; each
	// records the policy it was given (Egress).
	Egress bool
}

// Provider is the in-memory provider. It implements driver.Provider and
// driver.Lister and is safe for concurrent use.
type Provider struct {
	cfg Config

	mu      sync.Mutex
	rng     *rand.Rand
	objects map[uuid.UUID]*object
	seq     int
	calls   map[string]int

	agents      bool // objects run an agent (NewWithAgent)
	agentFaults AgentFaults
	received    []Message
}

type object struct {
	identity string
	image    string // the request's, "" for none
	egress   egress.Policy
	class    lease.RuntimeClass
	drift    *lease.RuntimeClass
	agent    *cellAgent // nil without agents
}

// remove deletes the cell's object; its agent dies with it. The caller
// holds p.mu.
func (p *Provider) remove(cellID uuid.UUID) {
	if o, ok := p.objects[cellID]; ok {
		delete(p.objects, cellID)
		if o.agent != nil {
			close(o.agent.dead)
		}
	}
}

// New returns a Provider.
func New(cfg Config) *Provider {
	if cfg.Mode == "" {
		cfg.Mode = driver.DryRun
	}
	if cfg.Kind == "" {
		cfg.Kind = "dry-run"
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Provider{
		cfg:     cfg,
		rng:     rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5bd1e995)),
		objects: map[uuid.UUID]*object{},
		calls:   map[string]int{},
	}
}

var _ interface {
	driver.Provider
	driver.Lister
} = (*Provider)(nil)

// Capabilities implements driver.Provider.
func (p *Provider) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Kind:           p.cfg.Kind,
		Mode:           p.cfg.Mode,
		RuntimeClasses: []lease.RuntimeClass{lease.GVisorLowerRisk, lease.KataMicroVM},
		Identity:       p.cfg.Kind,
		Images:         true, // any image: the object only records it
		Egress:         p.cfg.Egress,
	}
}

// chance draws one fault decision.
func (p *Provider) chance(prob float64) bool {
	if prob <= 0 {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64() < prob
}

func (p *Provider) wait(ctx context.Context) error {
	if p.cfg.Latency <= 0 {
		return ctx.Err()
	}
	return ctxsleep.Sleep(ctx, p.cfg.Latency)
}

func (p *Provider) count(op string) {
	p.mu.Lock()
	p.calls[op]++
	p.mu.Unlock()
}

// ErrInjected marks every injected failure.
var ErrInjected = errors.New("fake: injected fault")

// Provision implements driver.Provider.
func (p *Provider) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	p.count("provision")
	if err := p.wait(ctx); err != nil {
		return driver.Object{}, err
	}
	if p.chance(p.faults().ProvisionFailure) {
		return driver.Object{}, fmt.Errorf("%w: provision failed", ErrInjected)
	}
	if _, ok := driver.PinnedDigest(req.Image); req.Image != "" && !ok {
		return driver.Object{}, fmt.Errorf("fake: image %q is not pinned by digest", req.Image)
	}
	if !req.Egress.IsNone() && !p.cfg.Egress {
		return driver.Object{}, fmt.Errorf("fake: an egress allow-list was given to a provider that reports none")
	}
	p.mu.Lock()
	o, ok := p.objects[req.CellID]
	if !ok {
		p.seq++
		o = &object{identity: fmt.Sprintf("fake-%d", p.seq), class: req.RuntimeClass, image: cmp.Or(req.Image, p.cfg.Image),
			egress: req.Egress}
		if p.agents {
			o.agent = newCellAgent(p, req.CellID)
		}
		p.objects[req.CellID] = o
	}
	obj := driver.Object{CellID: req.CellID, Identity: o.identity}
	p.mu.Unlock()
	if p.chance(p.faults().LostResponse) {
		return driver.Object{}, fmt.Errorf("%w: provision response lost", ErrInjected)
	}
	return obj, nil
}

// Inspect implements driver.Provider.
func (p *Provider) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	p.count("inspect")
	if err := ctx.Err(); err != nil {
		return driver.Observation{}, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.objects[obj.CellID]
	if !ok {
		return driver.Observation{Detail: "no such object"}, nil
	}
	class := o.class
	if o.drift != nil {
		class = *o.drift
	}
	obs := driver.Observation{Exists: true, Identity: o.identity, RuntimeClass: class, Ready: true,
		Detail: "simulated (" + string(p.cfg.Mode) + ")"}
	if o.agent != nil {
		obs.AgentDigest = AgentDigest
	}
	obs.ImageDigest, _ = driver.PinnedDigest(o.image)
	return obs, nil
}

// Image returns the image the cell's object was provisioned with ("" for
// none, or when there is no object).
func (p *Provider) Image(cellID uuid.UUID) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if o, ok := p.objects[cellID]; ok {
		return o.image
	}
	return ""
}

// Egress returns the egress policy the cell's object was provisioned with
// (egress.None when there is no object).
func (p *Provider) Egress(cellID uuid.UUID) egress.Policy {
	p.mu.Lock()
	defer p.mu.Unlock()
	if o, ok := p.objects[cellID]; ok {
		return o.egress
	}
	return egress.None
}

// SetEgress implements driver.EgressEnforcer: the object records the
// policy (Egress), and fails with ErrInjected under Faults.SetEgress.
func (p *Provider) SetEgress(ctx context.Context, obj driver.Object, pol egress.Policy) error {
	p.count("set_egress")
	if err := ctx.Err(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	o, ok := p.objects[obj.CellID]
	if !ok {
		return fmt.Errorf("fake: cell %s: %w", obj.CellID, driver.ErrNotFound)
	}
	if p.cfg.Faults.SetEgress {
		return fmt.Errorf("%w: set egress", ErrInjected)
	}
	o.egress = pol
	return nil
}

// EgressCounts implements driver.EgressEnforcer: the fake's objects carry
// no traffic, so it knows none.
func (p *Provider) EgressCounts(driver.Object) map[string]driver.EgressCount { return nil }

// Destroy implements driver.Provider.
func (p *Provider) Destroy(ctx context.Context, obj driver.Object) error {
	p.count("destroy")
	if err := p.wait(ctx); err != nil {
		return fmt.Errorf("%w: %w", driver.ErrUncertain, err)
	}
	if p.chance(p.faults().DestroyTimeout) {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", driver.ErrUncertain, ctx.Err())
	}
	if p.chance(p.faults().DestroyUncertain) {
		return fmt.Errorf("%w: %w: delete accepted, absence not confirmed", driver.ErrUncertain, ErrInjected)
	}
	p.mu.Lock()
	if o, ok := p.objects[obj.CellID]; ok && (obj.Identity == "" || o.identity == obj.Identity) {
		p.remove(obj.CellID)
	}
	p.mu.Unlock()
	if p.chance(p.faults().LostResponse) {
		return fmt.Errorf("%w: %w: destroy response lost", driver.ErrUncertain, ErrInjected)
	}
	return nil
}

// List implements driver.Lister.
func (p *Provider) List(ctx context.Context) ([]driver.Object, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]driver.Object, 0, len(p.objects))
	for id, o := range p.objects {
		out = append(out, driver.Object{CellID: id, Identity: o.identity})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CellID.String() < out[j].CellID.String() })
	return out, nil
}

// SetFaults replaces the fault probabilities from now on.
func (p *Provider) SetFaults(f Faults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cfg.Faults = f
}

func (p *Provider) faults() Faults {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cfg.Faults
}

// Drift makes Inspect report class for the cell's object from now on, as if
// the provider had re-admitted it under another runtime.
func (p *Provider) Drift(cellID uuid.UUID, class lease.RuntimeClass) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if o, ok := p.objects[cellID]; ok {
		o.drift = &class
	}
}

// Vanish deletes the cell's object out of band, as a crash of the cell
// does: Inspect reports it gone, and its agent dies with it, so calls on a
// connection already open — a command running included — fail without an
// answer (driver.ErrCellLost).
func (p *Provider) Vanish(cellID uuid.UUID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.remove(cellID)
}

// Len returns the number of objects that exist.
func (p *Provider) Len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.objects)
}

// Calls returns how many times an operation ("provision", "inspect",
// "destroy") was called.
func (p *Provider) Calls(op string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls[op]
}
