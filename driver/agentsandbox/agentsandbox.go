package agentsandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/internal/inflight"
	"github.com/sandboxwich/sandboxwich/driver/internal/kubeconf"
	"github.com/sandboxwich/sandboxwich/driver/internal/podexec"
	"github.com/sandboxwich/sandboxwich/lease"
)

// API groups, versions and resources of agent-sandbox v0.5.6.
const (
	// ExtensionsGroup holds SandboxClaim, SandboxTemplate and
	// SandboxWarmPool.
	ExtensionsGroup = "extensions.agents.x-k8s.io"
	// SandboxGroup holds Sandbox.
	SandboxGroup = "agents.x-k8s.io"
	// V1beta1 is the preferred version (the CRDs' storage version).
	V1beta1 = "v1beta1"
	// V1alpha1 is the fallback when the server does not serve v1beta1.
	V1alpha1 = "v1alpha1"
)

// Labels the driver reads and writes.
const (
	// LabelManagedBy marks every object the driver creates.
	LabelManagedBy = kubeconf.LabelManagedBy
	// ManagedByValue is LabelManagedBy's value.
	ManagedByValue = kubeconf.ManagedByValue
	// LabelPool carries Config.Pool: an ownership label List selects on.
	LabelPool = kubeconf.LabelPool
	// LabelInstallation carries Config.Installation: the other ownership
	// label List selects on.
	LabelInstallation = kubeconf.LabelInstallation
	// LabelCellID carries the cell ID an object backs.
	LabelCellID = kubeconf.LabelCellID
	// LabelRuntimeClass records the class an object was requested for:
	// bookkeeping, never evidence.
	LabelRuntimeClass = kubeconf.LabelRuntimeClass
	// LabelClaimUID is the label agent-sandbox puts on the Pod it hands to
	// a claim: the claim's UID.
	LabelClaimUID = "agents.x-k8s.io/claim-uid"
	// ClaimNamePrefix starts every claim name; the cell ID follows.
	ClaimNamePrefix = "sbw-"
)

// Defaults of Config fields left zero.
const (
	DefaultBindTimeout   = 2 * time.Minute
	DefaultDeleteTimeout = 2 * time.Minute
)

// Config configures a Provider.
type Config struct {
	// RESTConfig reaches the API server (required).
	RESTConfig *rest.Config
	// Namespace holds the claims, Sandboxes and Pods (required).
	Namespace string
	// Pool is the ownership label value (sandboxwich.dev/pool) put on
	// every claim; List returns only claims carrying it.
	Pool string
	// Installation is the plane's installation tag,
	// driver.InstallationTag(store.Installation): required. It is put on
	// every claim as sandboxwich.dev/installation, and List returns only
	// claims carrying it too, so planes sharing a namespace and a pool name
	// never take each other's claims for orphans. Claims are still found
	// by name (sbw-<cell>), so those created before the label keep being
	// inspected and destroyed.
	Installation string
	// WarmPool is the SandboxWarmPool the claims draw from
	// (spec.warmPoolRef.name of a v1beta1 claim). Required.
	WarmPool string
	// Template is the SandboxTemplate a v1alpha1 claim names
	// (spec.sandboxTemplateRef.name); used only when the server does not
	// serve extensions.agents.x-k8s.io/v1beta1, and then required.
	Template string
	// RuntimeClassNames maps each served class to the name of the
	// RuntimeClass the warm pool's Pods must have been admitted with. At
	// least one; names must differ.
	RuntimeClassNames map[lease.RuntimeClass]string
	// Container is the container Exec runs commands in; empty means the
	// bound Pod's first container.
	Container string
	// BindTimeout bounds Provision's wait for the claim to be bound to a
	// Running Pod (default DefaultBindTimeout).
	BindTimeout time.Duration
	// DeleteTimeout bounds Destroy's wait for proof of absence (default
	// DefaultDeleteTimeout).
	DeleteTimeout time.Duration
	// Identity names the provider in Capabilities (default
	// "agent-sandbox:<namespace>/<pool>").
	Identity string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Provider backs each cell with one SandboxClaim and the warm Pod it is
// bound to. It implements driver.Provider, driver.Lister and driver.Execer
// and is safe for concurrent use.
type Provider struct {
	cfg    Config
	dyn    dynamic.Interface
	pods   k8s.Interface
	disc   discovery.DiscoveryInterface
	byName map[string]lease.RuntimeClass
	log    *slog.Logger

	gvMu     sync.Mutex
	claimGVR schema.GroupVersionResource // zero until resolved
	sboxGVR  schema.GroupVersionResource

	exec    *podexec.Runner
	creates inflight.Set // the claim creates of cells, for Destroy to wait out
}

var _ interface {
	driver.Provider
	driver.Lister
	driver.Execer
} = (*Provider)(nil)

// New validates cfg, fills its defaults and returns a Provider. It does no
// I/O: the served API versions are discovered on first use.
func New(cfg Config) (*Provider, error) {
	bad := func(field, rule string, args ...any) (*Provider, error) {
		return nil, fmt.Errorf("agentsandbox: %s %s", field, fmt.Sprintf(rule, args...))
	}
	if cfg.RESTConfig == nil {
		return bad("rest_config", "is required")
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return bad("namespace", "%q is invalid: %s", cfg.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(cfg.Pool); cfg.Pool == "" || len(errs) > 0 {
		return bad("pool", "%q must be a non-empty Kubernetes label value: %s", cfg.Pool, strings.Join(errs, "; "))
	}
	if err := driver.CheckInstallationTag(cfg.Installation); err != nil {
		return nil, fmt.Errorf("agentsandbox: %w", err)
	}
	if errs := validation.IsDNS1123Subdomain(cfg.WarmPool); len(errs) > 0 {
		return bad("warm_pool", "%q is not a valid SandboxWarmPool name", cfg.WarmPool)
	}
	if cfg.Template != "" {
		if errs := validation.IsDNS1123Subdomain(cfg.Template); len(errs) > 0 {
			return bad("template", "%q is not a valid SandboxTemplate name", cfg.Template)
		}
	}
	if cfg.Container != "" {
		if errs := validation.IsDNS1123Label(cfg.Container); len(errs) > 0 {
			return bad("container", "%q is not a valid container name", cfg.Container)
		}
	}
	byName, err := kubeconf.RuntimeClassIndex(cfg.RuntimeClassNames)
	if err != nil {
		return bad("runtime_class_names", "%v", err)
	}
	if cfg.BindTimeout <= 0 {
		cfg.BindTimeout = DefaultBindTimeout
	}
	if cfg.DeleteTimeout <= 0 {
		cfg.DeleteTimeout = DefaultDeleteTimeout
	}
	if cfg.Identity == "" {
		cfg.Identity = "agent-sandbox:" + cfg.Namespace + "/" + cfg.Pool
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Provider{cfg: cfg, byName: byName}
	if p.dyn, err = dynamic.NewForConfig(cfg.RESTConfig); err != nil {
		return nil, fmt.Errorf("agentsandbox: dynamic client: %w", err)
	}
	if p.pods, err = k8s.NewForConfig(cfg.RESTConfig); err != nil {
		return nil, fmt.Errorf("agentsandbox: client: %w", err)
	}
	p.disc = p.pods.Discovery()
	p.log = cfg.Logger.With("driver", "agent-sandbox", "namespace", cfg.Namespace, "pool", cfg.Pool)
	p.exec = &podexec.Runner{Config: cfg.RESTConfig, Namespace: cfg.Namespace, Log: p.log}
	return p, nil
}

// ErrImageFromTemplate is returned (wrapped) by Provision for a request
// that names an image (driver.ProvisionRequest.Image): a cell's Pod comes
// from the warm pool's SandboxTemplate, whose image the plane does not
// choose, so this provider serves no image class (CONTRACT §21). Nothing
// is created.
var ErrImageFromTemplate = errors.New("agent-sandbox cells run the image of the warm pool's SandboxTemplate, " +
	"which the plane does not choose: the provider cannot make a cell of a requested image (no image classes, CONTRACT §21)")

// Capabilities implements driver.Provider. Images is false: the warm
// pool's template, not the plane, chooses a cell's image.
func (p *Provider) Capabilities() driver.Capabilities {
	classes := slices.Sorted(maps.Keys(p.cfg.RuntimeClassNames))
	return driver.Capabilities{Kind: "agent-sandbox", Mode: driver.Apply, RuntimeClasses: classes, Identity: p.cfg.Identity,
		Images: false}
}

// ClaimName is the name of the SandboxClaim that backs a cell.
func ClaimName(cellID uuid.UUID) string { return ClaimNamePrefix + cellID.String() }

// versions returns the claim and Sandbox resources to use: v1beta1 when
// discovery shows the server serves it, else v1alpha1. The answer is
// cached once discovery succeeded.
func (p *Provider) versions() (claim, sandbox schema.GroupVersionResource, err error) {
	p.gvMu.Lock()
	defer p.gvMu.Unlock()
	if p.claimGVR.Resource != "" {
		return p.claimGVR, p.sboxGVR, nil
	}
	pick := func(group, resource string) (schema.GroupVersionResource, error) {
		for _, v := range []string{V1beta1, V1alpha1} {
			served, err := servesResource(p.disc, group+"/"+v, resource)
			if err != nil {
				return schema.GroupVersionResource{}, err
			}
			if served {
				return schema.GroupVersionResource{Group: group, Version: v, Resource: resource}, nil
			}
		}
		return schema.GroupVersionResource{}, fmt.Errorf("the server serves neither %s/%s nor %s/%s %s: are the agent-sandbox CRDs installed?",
			group, V1beta1, group, V1alpha1, resource)
	}
	if claim, err = pick(ExtensionsGroup, "sandboxclaims"); err != nil {
		return claim, sandbox, fmt.Errorf("agentsandbox: discovery: %w", err)
	}
	if claim.Version == V1alpha1 && p.cfg.Template == "" {
		return claim, sandbox, errors.New("agentsandbox: the server serves SandboxClaim only as v1alpha1, which needs a template (Config.Template)")
	}
	if sandbox, err = pick(SandboxGroup, "sandboxes"); err != nil {
		return claim, sandbox, fmt.Errorf("agentsandbox: discovery: %w", err)
	}
	p.claimGVR, p.sboxGVR = claim, sandbox
	p.log.Info("agent-sandbox API versions", "claim", claim.Version, "sandbox", sandbox.Version)
	return claim, sandbox, nil
}

// servesResource reports whether the server serves resource in groupVersion.
func servesResource(d discovery.DiscoveryInterface, groupVersion, resource string) (bool, error) {
	list, err := d.ServerResourcesForGroupVersion(groupVersion)
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, r := range list.APIResources {
		if r.Name == resource {
			return true, nil
		}
	}
	return false, nil
}

func (p *Provider) claims(gvr schema.GroupVersionResource) dynamic.ResourceInterface {
	return p.dyn.Resource(gvr).Namespace(p.cfg.Namespace)
}

// claimObject is the SandboxClaim for a cell.
func (p *Provider) claimObject(gvr schema.GroupVersionResource, cellID uuid.UUID, class lease.RuntimeClass) *unstructured.Unstructured {
	spec := map[string]any{"warmPoolRef": map[string]any{"name": p.cfg.WarmPool}}
	if gvr.Version == V1alpha1 {
		spec = map[string]any{"sandboxTemplateRef": map[string]any{"name": p.cfg.Template}}
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": gvr.GroupVersion().String(),
		"kind":       "SandboxClaim",
		"metadata": map[string]any{
			"name":      ClaimName(cellID),
			"namespace": p.cfg.Namespace,
			"labels": map[string]any{
				LabelManagedBy:    ManagedByValue,
				LabelPool:         p.cfg.Pool,
				LabelInstallation: p.cfg.Installation,
				LabelCellID:       cellID.String(),
				LabelRuntimeClass: string(class),
			},
		},
		"spec": spec,
	}}
	return u
}

// owned checks that a claim found under a cell's name carries this pool's
// ownership labels.
func (p *Provider) owned(claim *unstructured.Unstructured, cellID uuid.UUID) error {
	l := claim.GetLabels()
	if l[LabelManagedBy] != ManagedByValue || l[LabelPool] != p.cfg.Pool || l[LabelCellID] != cellID.String() {
		return fmt.Errorf("claim %s (uid %s) does not carry the ownership labels of pool %q", claim.GetName(), claim.GetUID(), p.cfg.Pool)
	}
	return nil
}

// Provision implements driver.Provider. It creates the cell's SandboxClaim
// (or finds the one an earlier call created) and waits, within ctx and
// BindTimeout, until agent-sandbox has bound it: the claim's
// status.sandbox.name names a Sandbox whose status.selector selects
// exactly one Pod, controlled by that Sandbox, labelled with the claim's
// UID, Running and ready, with no container ever restarted, and admitted
// with the RuntimeClass configured for req.RuntimeClass. The returned
// identity records the claim's, the Sandbox's and the Pod's UIDs.
//
// A chain that cannot be the claim's own fresh Pod (two Pods selected, a
// foreign owner or claim UID, a restarted Pod, another or no RuntimeClass)
// fails at once with a *driver.VerifyError
// (runtime_class_boundary_unverified). On any error the claim is left for
// the caller's Destroy, and the returned object carries whatever part of
// the identity was found.
//
// A request that names an image (req.Image) fails with
// ErrImageFromTemplate before anything is created.
func (p *Provider) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	obj := driver.Object{CellID: req.CellID}
	name := ClaimName(req.CellID)
	fail := func(err error) (driver.Object, error) {
		return obj, fmt.Errorf("agentsandbox: provision %s: %w", name, err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	if req.Image != "" {
		return fail(fmt.Errorf("image %q: %w", req.Image, ErrImageFromTemplate))
	}
	if _, ok := p.cfg.RuntimeClassNames[req.RuntimeClass]; !ok {
		return fail(fmt.Errorf("runtime class %q is not configured", req.RuntimeClass))
	}
	claimGVR, _, err := p.versions()
	if err != nil {
		return fail(err)
	}
	log := p.log.With("cell_id", req.CellID, "claim", name)
	var claim *unstructured.Unstructured
	err = p.creates.Do(ctx, req.CellID, func(ctx context.Context) (err error) {
		claim, err = p.claims(claimGVR).Create(ctx, p.claimObject(claimGVR, req.CellID, req.RuntimeClass), metav1.CreateOptions{})
		return err
	})
	switch {
	case err == nil:
		log.Info("claim created", "uid", claim.GetUID(), "warm_pool", p.cfg.WarmPool)
	case apierrors.IsAlreadyExists(err):
		// A retry: the claim of an earlier call is this cell's object.
		if claim, err = p.claims(claimGVR).Get(ctx, name, metav1.GetOptions{}); err != nil {
			return fail(fmt.Errorf("reading the existing claim: %w", err))
		}
		if err := p.owned(claim, req.CellID); err != nil {
			return fail(err)
		}
		if claim.GetDeletionTimestamp() != nil {
			return fail(fmt.Errorf("the existing claim %s is being deleted", claim.GetUID()))
		}
		if got := lease.RuntimeClass(claim.GetLabels()[LabelRuntimeClass]); got != req.RuntimeClass {
			return fail(fmt.Errorf("the existing claim %s was made for class %q", claim.GetUID(), got))
		}
		log.Info("claim exists", "uid", claim.GetUID())
	default:
		return fail(fmt.Errorf("create: %w", err))
	}
	claimUID := claim.GetUID()
	obj.Identity = identity{Claim: claimUID}.String()

	bctx, cancel := context.WithTimeout(ctx, p.cfg.BindTimeout)
	defer cancel()
	delay := 25 * time.Millisecond
	last := "claim not read yet"
	for {
		c, err := p.resolve(bctx, req.CellID)
		switch {
		case err != nil:
			last = err.Error()
		case c.claim == nil:
			return fail(fmt.Errorf("claim %s disappeared while waiting for it to be bound", claimUID))
		case c.id.Claim != claimUID:
			return fail(fmt.Errorf("claim %s was replaced by %s while waiting for it to be bound", claimUID, c.id.Claim))
		default:
			obj.Identity = c.id.String()
			if len(c.problems) > 0 {
				verr := &driver.VerifyError{Reason: c.detail()}
				log.Warn("bound pod failed verification", "identity", obj.Identity, "error", verr)
				return fail(verr)
			}
			if c.ready() {
				log.Info("claim bound", "identity", obj.Identity)
				return obj, nil
			}
			last = c.detail()
		}
		select {
		case <-bctx.Done():
			if ctx.Err() != nil {
				return fail(fmt.Errorf("%w (%s)", ctx.Err(), last))
			}
			return fail(fmt.Errorf("claim not bound to a ready pod within %v: %s", p.cfg.BindTimeout, last))
		case <-time.After(delay):
		}
		delay = min(delay*2, 500*time.Millisecond)
	}
}

// Inspect implements driver.Provider: it follows the chain afresh from the
// claim named after the cell. Exists reports that the claim exists;
// Identity is the chain found. RuntimeClass is reported only when the
// chain is whole and consistent (see Provision), names the same three
// UIDs as obj.Identity (when it is set), and the Pod was admitted with the
// RuntimeClass configured for the class the claim was made for, is
// Running and has never restarted; else it is "".
func (p *Provider) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	c, err := p.resolve(ctx, obj.CellID)
	if err != nil {
		return driver.Observation{}, fmt.Errorf("agentsandbox: inspect %s: %w", ClaimName(obj.CellID), err)
	}
	return c.observe(obj), nil
}

// Destroy implements driver.Provider. It deletes the cell's claim with
// foreground propagation and a UID precondition, then reads back the
// claim, the Sandbox and the Pod recorded in obj.Identity (and those the
// claim still names) until each is absent: not found, or its name now
// belongs to another UID. Only then does it return nil. Anything less is
// returned wrapping driver.ErrUncertain: the pool keeps the member
// cleanup_pending and retries.
//
// An empty obj.Identity names whatever claim backs the cell, if it carries
// this pool's ownership labels.
func (p *Provider) Destroy(ctx context.Context, obj driver.Object) error {
	name := ClaimName(obj.CellID)
	uncertain := func(format string, args ...any) error {
		return fmt.Errorf("agentsandbox: destroy %s: %w: %s", name, driver.ErrUncertain, fmt.Sprintf(format, args...))
	}
	id, ok := parseIdentity(obj.Identity)
	if !ok {
		// Not an identity this driver made: it names no claim of ours.
		// Whatever holds the name is another object.
		id = identity{Claim: types.UID(obj.Identity)}
	}
	claimGVR, sboxGVR, err := p.versions()
	if err != nil {
		return uncertain("%v", err)
	}
	if err := p.creates.Wait(ctx, obj.CellID); err != nil {
		return uncertain("%v", err)
	}
	dctx, cancel := context.WithTimeout(ctx, p.cfg.DeleteTimeout)
	defer cancel()

	want := []target{} // objects whose absence proves the destroy
	claim, err := p.claims(claimGVR).Get(dctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return uncertain("reading the claim: %v", err)
	case id.Claim != "" && claim.GetUID() != id.Claim:
		// The name belongs to another claim: ours is gone.
	default:
		if id.Claim == "" {
			if err := p.owned(claim, obj.CellID); err != nil {
				return uncertain("%v; not deleting it", err)
			}
			// Not named by identity: confirm whatever the claim is bound to.
			id = p.discover(dctx, claim)
		}
		uid := claim.GetUID()
		err := p.claims(claimGVR).Delete(dctx, name, metav1.DeleteOptions{
			Preconditions:     &metav1.Preconditions{UID: &uid},
			PropagationPolicy: ptr(metav1.DeletePropagationForeground),
		})
		switch {
		case err == nil:
			p.log.Info("claim delete accepted", "cell_id", obj.CellID, "identity", id.String())
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone, or the name is another claim's now: the reads below tell.
		default:
			return uncertain("delete: %v", err)
		}
	}
	if id.Claim != "" {
		want = append(want, target{"claim", dynGetter{p.claims(claimGVR)}, ref{Name: name, UID: id.Claim}})
	}
	if !id.Sandbox.empty() {
		want = append(want, target{"sandbox", dynGetter{p.dyn.Resource(sboxGVR).Namespace(p.cfg.Namespace)}, id.Sandbox})
	}
	if !id.Pod.empty() {
		want = append(want, target{"pod", p.podGetter(), id.Pod})
	}
	return waitAbsent(dctx, want, func(last string) error {
		return uncertain("absence of %s not confirmed: %s (%v)", id.String(), last, dctx.Err())
	})
}

// discover reads what a claim is bound to right now, for a destroy not
// named by identity: the Sandbox its status names and the Pod the Sandbox
// selects with the claim's UID label.
func (p *Provider) discover(ctx context.Context, claim *unstructured.Unstructured) identity {
	id := identity{Claim: claim.GetUID()}
	cellID, _ := uuid.Parse(strings.TrimPrefix(claim.GetName(), ClaimNamePrefix))
	if c, err := p.resolve(ctx, cellID); err == nil && c.id.Claim == id.Claim {
		id = c.id
	}
	return id
}

// getter reads one object by name and reports its UID and whether it is
// terminating.
type getter interface {
	get(ctx context.Context, name string) (uid types.UID, detail string, err error)
}

type target struct {
	kind string
	g    getter
	ref  ref
}

func (r dynGetter) get(ctx context.Context, name string) (types.UID, string, error) {
	u, err := r.ResourceInterface.Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	return u.GetUID(), terminating(u.GetDeletionTimestamp(), u.GetFinalizers()), nil
}

type dynGetter struct{ dynamic.ResourceInterface }

type podGetter struct{ p *Provider }

func (g podGetter) get(ctx context.Context, name string) (types.UID, string, error) {
	pod, err := g.p.podClient().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	return pod.UID, terminating(pod.DeletionTimestamp, pod.Finalizers), nil
}

func (p *Provider) podGetter() getter { return podGetter{p} }

func terminating(ts *metav1.Time, finalizers []string) string {
	if ts == nil {
		return "still exists"
	}
	return fmt.Sprintf("still terminating (deletion requested %s, finalizers %v)", ts.UTC().Format(time.RFC3339), finalizers)
}

// waitAbsent polls until every target is absent, or ctx ends.
func waitAbsent(ctx context.Context, want []target, uncertain func(last string) error) error {
	delay := 25 * time.Millisecond
	for {
		var pending []string
		for _, t := range want {
			uid, detail, err := t.g.get(ctx, t.ref.Name)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				pending = append(pending, fmt.Sprintf("%s %s: %v", t.kind, t.ref.Name, err))
			case uid != t.ref.UID:
				// The name belongs to another object: ours is gone.
			default:
				pending = append(pending, fmt.Sprintf("%s %s %s", t.kind, t.ref, detail))
			}
		}
		if len(pending) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return uncertain(strings.Join(pending, "; "))
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}

// List implements driver.Lister: every claim of this pool, found by its
// ownership labels (terminating ones included), with the identity of the
// chain it resolves to now.
func (p *Provider) List(ctx context.Context) ([]driver.Object, error) {
	claimGVR, _, err := p.versions()
	if err != nil {
		return nil, err
	}
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByValue, LabelPool: p.cfg.Pool,
		LabelInstallation: p.cfg.Installation}).String()
	var out []driver.Object
	opts := metav1.ListOptions{LabelSelector: sel}
	for {
		list, err := p.claims(claimGVR).List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("agentsandbox: list: %w", err)
		}
		for i := range list.Items {
			claim := &list.Items[i]
			id, err := uuid.Parse(claim.GetLabels()[LabelCellID])
			if err != nil || claim.GetName() != ClaimName(id) {
				p.log.Warn("claim with ownership labels but no matching cell id", "claim", claim.GetName())
				continue
			}
			out = append(out, driver.Object{CellID: id, Identity: p.discover(ctx, claim).String()})
		}
		if list.GetContinue() == "" {
			break
		}
		opts.Continue = list.GetContinue()
	}
	slices.SortFunc(out, func(a, b driver.Object) int { return strings.Compare(a.CellID.String(), b.CellID.String()) })
	return out, nil
}

func ptr[T any](v T) *T { return &v }

// podClient is the namespace's Pod client.
func (p *Provider) podClient() podInterface { return p.pods.CoreV1().Pods(p.cfg.Namespace) }

type podInterface interface {
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
}
