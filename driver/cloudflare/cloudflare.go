package cloudflare

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/internal/inflight"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Kind is the provider kind.
const Kind = "cloudflare"

// DefaultContainerClass is the bridge's Durable Object class with the
// container (bridge/wrangler.jsonc).
const DefaultContainerClass = "CellObject"

// DefaultReadyTimeout bounds Provision's wait for a new cell's agent.
const DefaultReadyTimeout = 2 * time.Minute

// backendCloudflare is what the bridge reports for a real Cloudflare
// Container behind its Durable Object.
const backendCloudflare = "cloudflare-container"

// Config configures a Provider.
type Config struct {
	// BridgeURL is the bridge Worker's URL (https; http only to a
	// loopback address, for a local workerd).
	BridgeURL string
	// BridgeTokenFile holds the bridge's bearer token.
	BridgeTokenFile string
	// Pool names the pool; with Installation it is the label the bridge
	// files the cells under, so List returns only this pool's cells.
	Pool, Installation string
	// RuntimeClass is the signed runtime class a Cloudflare Container
	// counts as: an explicit operator decision with no default. It is
	// reported only while the read-back proves the configured deployment
	// and the bridge's status of the cell agrees with it.
	RuntimeClass lease.RuntimeClass
	// Image is the cell image reference, pinned by digest
	// (repository@sha256:…), exactly as the container application runs it.
	Image string
	// InstanceType is the container application's instance type.
	InstanceType string
	// ContainerClass is the Durable Object class with the container; ""
	// means DefaultContainerClass.
	ContainerClass string
	// AgentDigest is "sha256:<hex>" of the cell agent binary in Image
	// (printed by the image build, see the README): what the plane expects
	// the agent to report.
	AgentDigest string
	// ReadBack configures the Cloudflare API read-back. Without it
	// (ReadBack.APITokenFile empty) the runtime class is never admitted.
	ReadBack ReadBack
	// ReadyTimeout bounds Provision's wait; zero means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// HTTPClient carries the bridge traffic; nil means a default client.
	HTTPClient *http.Client
	// Logger receives the driver's logs (never a token); nil discards.
	Logger *slog.Logger
}

var sha256Digest = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// Provider runs each cell as a Cloudflare Container behind the bridge
// Worker (CONTRACT §18). It implements driver.Provider, driver.Lister and
// driver.AgentHost.
type Provider struct {
	cfg  Config
	b    *bridge
	rb   *readBack // nil: no read-back configured
	pool string
	log  *slog.Logger
	now  func() time.Time

	// backend is the backend the bridge must report for the runtime
	// class to be admitted: a real Cloudflare Container. Tests that run
	// the bridge in a local workerd set it to its loopback backend.
	backend string

	mu      sync.Mutex
	clients map[string]*agent.Client // by identity

	creates inflight.Set // the cell creates, for Destroy to wait out
}

var (
	_ driver.Provider  = (*Provider)(nil)
	_ driver.Lister    = (*Provider)(nil)
	_ driver.AgentHost = (*Provider)(nil)
)

// New checks cfg and returns a Provider. It makes no request; call
// VerifyDeployment to read the deployment back at start-up.
func New(cfg Config) (*Provider, error) {
	if cfg.ContainerClass == "" {
		cfg.ContainerClass = DefaultContainerClass
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	var errs []error
	if !cfg.RuntimeClass.Valid() {
		errs = append(errs, fmt.Errorf("cloudflare: runtime_class %q: name the signed runtime class a Cloudflare Container counts as (there is no default)", cfg.RuntimeClass))
	}
	if !digestRef.MatchString(cfg.Image) {
		errs = append(errs, fmt.Errorf("cloudflare: image %q is not pinned by digest (repository@sha256:<64 hex>)", cfg.Image))
	}
	if cfg.InstanceType == "" {
		errs = append(errs, errors.New("cloudflare: instance_type is required"))
	}
	if !sha256Digest.MatchString(cfg.AgentDigest) {
		errs = append(errs, fmt.Errorf("cloudflare: agent_digest %q is not sha256:<64 hex>", cfg.AgentDigest))
	}
	if cfg.Pool == "" {
		errs = append(errs, errors.New("cloudflare: the pool name is required"))
	}
	b, err := newBridge(cfg.BridgeURL, cfg.BridgeTokenFile, cfg.HTTPClient)
	errs = append(errs, err)
	var rb *readBack
	if cfg.ReadBack.APITokenFile != "" || cfg.ReadBack.AccountID != "" {
		rb, err = newReadBack(cfg.ReadBack, expectation{containerClass: cfg.ContainerClass, image: cfg.Image, instanceType: cfg.InstanceType})
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	pool := cfg.Pool
	if cfg.Installation != "" {
		pool = cfg.Installation + ":" + cfg.Pool
	}
	return &Provider{cfg: cfg, b: b, rb: rb, pool: poolLabel(pool), log: log, now: time.Now,
		backend: backendCloudflare, clients: map[string]*agent.Client{}}, nil
}

// poolLabel maps a pool name to the characters the bridge accepts.
func poolLabel(s string) string {
	out := []rune{}
	for _, r := range s {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == ':' || r == '/' || r == '-' {
			out = append(out, r)
		} else {
			out = append(out, '-')
		}
	}
	if len(out) > 200 {
		out = out[:200]
	}
	if len(out) > 0 && !(out[0] >= 'a' && out[0] <= 'z' || out[0] >= 'A' && out[0] <= 'Z' || out[0] >= '0' && out[0] <= '9') {
		out[0] = 'p'
	}
	return string(out)
}

// Capabilities reports the provider. It does no I/O.
func (p *Provider) Capabilities() driver.Capabilities {
	return driver.Capabilities{Kind: Kind, Mode: driver.Apply, RuntimeClasses: []lease.RuntimeClass{p.cfg.RuntimeClass},
		Identity: "cloudflare:" + p.b.base.Host}
}

// VerifyDeployment reads the deployed bridge back through the Cloudflare
// API now (and caches the result for the read-back interval). It returns
// what was proven, or why nothing was: a *ReadBackError, ErrUnauthorized,
// or the bridge's own configuration disagreeing with the driver's.
func (p *Provider) VerifyDeployment(ctx context.Context) (Deployment, error) {
	if p.rb == nil {
		return Deployment{}, &ReadBackError{Reason: errReadBackOff.Error()}
	}
	p.rb.mu.Lock()
	p.rb.at = time.Time{} // force a new read-back
	p.rb.mu.Unlock()
	d, err := p.rb.current(ctx, p.now())
	if err != nil {
		return d, err
	}
	var info bridgeInfo
	if err := p.b.call(ctx, http.MethodGet, "/v1/bridge", nil, nil, &info); err != nil {
		return Deployment{}, err
	}
	if info.ContainerClass != p.cfg.ContainerClass || info.Image != p.cfg.Image || info.InstanceType != p.cfg.InstanceType {
		return Deployment{}, mismatch("the bridge reports class %q, image %q, instance type %q", info.ContainerClass, info.Image, info.InstanceType)
	}
	return d, nil
}

// Provision creates the cell's Durable Object and container through the
// bridge (idempotent by cell ID) and waits until its agent answers.
func (p *Provider) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	if req.RuntimeClass != p.cfg.RuntimeClass {
		return driver.Object{}, fmt.Errorf("cloudflare: runtime class %s is not served (this pool serves %s)", req.RuntimeClass, p.cfg.RuntimeClass)
	}
	if req.Image != "" {
		return driver.Object{}, fmt.Errorf("cloudflare: %w", driver.ErrImageUnsupported)
	}
	id := req.CellID.String()
	var st cellStatus
	err := p.creates.Do(ctx, req.CellID, func(ctx context.Context) error {
		return p.b.call(ctx, http.MethodPost, "/v1/cells", nil, map[string]string{"cell_id": id, "pool": p.pool}, &st)
	})
	if err != nil {
		return driver.Object{}, fmt.Errorf("cloudflare: provision %s: %w", id, err)
	}
	obj := driver.Object{CellID: req.CellID, Identity: st.Identity}
	wait, cancel := context.WithTimeout(ctx, p.cfg.ReadyTimeout)
	defer cancel()
	delay := 20 * time.Millisecond
	for !st.Ready {
		if st.State == "ended" {
			return obj, fmt.Errorf("cloudflare: provision %s: the cell ended (%s) before it was ready", id, deref(st.EndedReason))
		}
		select {
		case <-wait.Done():
			return obj, fmt.Errorf("cloudflare: provision %s: the cell agent did not answer: %w", id, wait.Err())
		case <-time.After(delay):
		}
		delay = min(2*delay, 500*time.Millisecond)
		if err := p.b.call(wait, http.MethodGet, cellPath(id), nil, nil, &st); err != nil {
			return obj, fmt.Errorf("cloudflare: provision %s: %w", id, err)
		}
		if st.Identity != obj.Identity {
			return obj, fmt.Errorf("cloudflare: provision %s: the identity changed from %s to %s", id, obj.Identity, st.Identity)
		}
	}
	p.log.Info("cloudflare cell ready", "cell_id", id, "identity", obj.Identity)
	return obj, nil
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// status reads a cell's status; a missing cell is (nil, nil).
func (p *Provider) status(ctx context.Context, id uuid.UUID) (*cellStatus, error) {
	var st cellStatus
	err := p.b.call(ctx, http.MethodGet, cellPath(id.String()), nil, nil, &st)
	var be *BridgeError
	if errors.As(err, &be) && be.Code == "cell_not_found" {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &st, nil
}

// Inspect reads the cell back through the bridge. The runtime class is
// reported only when the Cloudflare read-back proves the configured
// deployment and the bridge's status of the cell agrees with it (same
// container class, image and instance type, a real Cloudflare Container).
func (p *Provider) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	st, err := p.status(ctx, obj.CellID)
	if err != nil {
		return driver.Observation{}, fmt.Errorf("cloudflare: inspect %s: %w", obj.CellID, err)
	}
	if st == nil {
		return driver.Observation{Exists: false, Detail: "the bridge has no cell of that ID"}, nil
	}
	o := driver.Observation{Exists: true, Identity: st.Identity, Ready: st.Ready && st.State != "ended"}
	if st.State == "ended" {
		o.Detail = "the cell ended: " + deref(st.EndedReason)
		return o, nil
	}
	if why := p.admit(ctx, st); why != "" {
		o.Detail = "runtime class not admitted: " + why
		return o, nil
	}
	o.RuntimeClass = p.cfg.RuntimeClass
	o.AgentDigest = p.cfg.AgentDigest
	o.Detail = fmt.Sprintf("cloudflare container %s, instance type %s, bridge %s", st.Image, st.InstanceType, st.BridgeVersion)
	return o, nil
}

// admit returns "" when the runtime class can be reported for st, else
// why not.
func (p *Provider) admit(ctx context.Context, st *cellStatus) string {
	if p.rb == nil {
		return errReadBackOff.Error()
	}
	d, err := p.rb.current(ctx, p.now())
	if err != nil {
		p.log.Warn("cloudflare read-back failed: runtime class not admitted", "error", err.Error())
		return err.Error()
	}
	switch {
	case st.Backend != p.backend:
		return fmt.Sprintf("the bridge runs the cell on %q, not a Cloudflare Container", st.Backend)
	case st.ContainerClass != p.cfg.ContainerClass:
		return fmt.Sprintf("the cell started in class %q, not %q", st.ContainerClass, p.cfg.ContainerClass)
	case st.Image != d.Image:
		return fmt.Sprintf("the cell started with image %q, the deployment runs %q", st.Image, d.Image)
	case st.InstanceType != d.InstanceType:
		return fmt.Sprintf("the cell started with instance type %q, the deployment has %q", st.InstanceType, d.InstanceType)
	case !st.Started:
		return "the cell's container has not started"
	}
	return ""
}

// Destroy deletes the cell through the bridge, which destroys the
// container and reads its absence back. Only the bridge's "absent" (or the
// cell ID now naming another identity) is proof; anything else wraps
// driver.ErrUncertain.
func (p *Provider) Destroy(ctx context.Context, obj driver.Object) error {
	id := obj.CellID.String()
	if err := p.creates.Wait(ctx, obj.CellID); err != nil {
		return fmt.Errorf("cloudflare: destroy %s: %w: %v", id, driver.ErrUncertain, err)
	}
	hdr := http.Header{}
	if obj.Identity != "" {
		hdr.Set(identityHeader, obj.Identity)
	}
	var ans struct {
		Absent   bool    `json:"absent"`
		Identity *string `json:"identity"`
	}
	err := p.b.call(ctx, http.MethodDelete, cellPath(id), hdr, nil, &ans)
	var be *BridgeError
	switch {
	case errors.As(err, &be) && be.Code == "identity_mismatch":
		p.dropClient(obj.Identity)
		return nil // the name belongs to another identity: this object is gone
	case err != nil:
		return fmt.Errorf("cloudflare: destroy %s: %w: %w", id, driver.ErrUncertain, err)
	case !ans.Absent:
		return fmt.Errorf("cloudflare: destroy %s: %w: the bridge did not report absence", id, driver.ErrUncertain)
	}
	p.dropClient(obj.Identity)
	return nil
}

// List returns every cell the bridge holds for this pool, each with its
// identity.
func (p *Provider) List(ctx context.Context) ([]driver.Object, error) {
	var ans struct {
		Cells []string `json:"cells"`
	}
	if err := p.b.call(ctx, http.MethodGet, "/v1/cells?pool="+queryEscape(p.pool), nil, nil, &ans); err != nil {
		return nil, fmt.Errorf("cloudflare: list: %w", err)
	}
	objs := make([]driver.Object, 0, len(ans.Cells))
	for _, c := range ans.Cells {
		id, err := uuid.Parse(c)
		if err != nil {
			return nil, fmt.Errorf("cloudflare: list: the bridge listed %q", c)
		}
		st, err := p.status(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("cloudflare: list: %w", err)
		}
		obj := driver.Object{CellID: id}
		if st != nil {
			obj.Identity = st.Identity
		}
		objs = append(objs, obj)
	}
	return objs, nil
}

// Agent returns a connection to the cell's agent through the bridge. A
// missing cell (or one of another identity) is driver.ErrNotFound; an
// ended cell whose container stopped or restarted is driver.ErrCellLost.
func (p *Provider) Agent(ctx context.Context, obj driver.Object) (agent.Conn, error) {
	st, err := p.status(ctx, obj.CellID)
	if err != nil {
		return nil, fmt.Errorf("cloudflare: agent of %s: %w", obj.CellID, err)
	}
	if st == nil || (obj.Identity != "" && st.Identity != obj.Identity) {
		return nil, fmt.Errorf("cloudflare: agent of %s: %w", obj.CellID, driver.ErrNotFound)
	}
	if st.State == "ended" && deref(st.EndedReason) == "cell_lost" {
		return nil, fmt.Errorf("cloudflare: agent of %s: %w (its container stopped or restarted)", obj.CellID, driver.ErrCellLost)
	}
	return p.client(obj.CellID.String(), st.Identity), nil
}

func (p *Provider) client(id, identity string) *agent.Client {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c, ok := p.clients[identity]; ok {
		return c
	}
	c := agent.NewClientTransport(&agentTransport{b: p.b, cellID: id, identity: identity})
	p.clients[identity] = c
	return c
}

func (p *Provider) dropClient(identity string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.clients, identity)
}
