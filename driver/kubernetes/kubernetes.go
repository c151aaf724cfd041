package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/internal/inflight"
	"github.com/sandboxwich/sandboxwich/driver/internal/kubeconf"
	"github.com/sandboxwich/sandboxwich/driver/internal/podexec"
	"github.com/sandboxwich/sandboxwich/internal/imageref"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Labels and names the driver puts on its objects.
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
	// AnnotationImage records, on every Pod, the image the driver created
	// the cell container with (the provision's own image, or
	// Config.Image): verification reads it back and requires the admitted
	// container to run exactly it.
	AnnotationImage = "sandboxwich.dev/image"
	// PodNamePrefix starts every Pod name; the cell ID follows.
	PodNamePrefix = "sbw-"
	// ContainerName is the name of the cell's only container.
	ContainerName = "cell"
)

// Defaults of Config fields left zero.
const (
	DefaultCPU                    = "1"
	DefaultMemory                 = "512Mi"
	DefaultTmpSize                = "256Mi"
	DefaultReadyTimeout           = 90 * time.Second
	DefaultTerminationGracePeriod = 5 * time.Second
	DefaultRunAsUser              = 65532
)

// DefaultCommand keeps the cell's container alive.
var DefaultCommand = []string{"sleep", "infinity"}

// Config configures a Provider.
type Config struct {
	// RESTConfig reaches the API server. It is required for Exec
	// (pods/exec streams are opened with it) and builds Client when Client
	// is nil.
	RESTConfig *rest.Config
	// Client is the typed clientset for Pods and NetworkPolicies. Nil
	// builds one from RESTConfig; tests may pass a fake clientset.
	Client k8s.Interface
	// Namespace holds the pool's Pods (required).
	Namespace string
	// Pool is the ownership label value (sandboxwich.dev/pool): List
	// returns only Pods carrying it. It must be a valid label value.
	Pool string
	// Installation is the plane's installation tag,
	// driver.InstallationTag(store.Installation): required. It is put on
	// every Pod as sandboxwich.dev/installation, and List returns only Pods
	// carrying it too, so planes sharing a namespace and a pool name never
	// take each other's Pods for orphans. Pods are still found by name
	// (sbw-<cell>), so those created before the label keep being inspected
	// and destroyed.
	Installation string
	// RuntimeClassNames maps each served class to the name of a
	// RuntimeClass object in the cluster, e.g. gvisor_lower_risk →
	// "gvisor", kata_microvm → "kata". At least one; names must differ.
	RuntimeClassNames map[lease.RuntimeClass]string
	// Image is the cell image, pinned by digest (name@sha256:<64 hex>):
	// the image of every Pod whose provision names none
	// (driver.ProvisionRequest.Image). Required unless ImageClass is
	// set, and then it must be empty.
	Image string
	// ImageClass says the pool is an image class (CONTRACT §21, the pool
	// key images; setting image_class): every provision names its cell's
	// image (driver.ProvisionRequest.Image), so Image is empty, and a
	// provision that names none fails with ErrNoImage, creating nothing.
	ImageClass bool
	// Command keeps the container alive (default DefaultCommand). The
	// image must also hold sh, env, cat, kill and sleep for Exec.
	Command []string
	// CPU and Memory are the container's requests and limits (defaults
	// DefaultCPU, DefaultMemory). The CPU limit is a CFS quota per 100 ms
	// period over the whole sandbox (gVisor's sentry and gofer as well as
	// the workload): a small one, such as 50m, makes every command that
	// bursts past it wait for the next period, so commands take multiples
	// of 100 ms (docs/performance.md). TmpSize is the older name of
	// CellDiskBytes, as a quantity; the root file system is read-only.
	CPU, Memory, TmpSize string
	// CellDiskBytes is the size of the cell's writable storage (the pool
	// key cell_disk_bytes, CONTRACT §25): the memory-backed emptyDirs
	// the cell container writes (/tmp, and the agent's home with
	// AgentImage, half each) together, and the container's
	// ephemeral-storage limit. It must be below Memory; default half of
	// it. New fails naming the key otherwise. Inspect refuses an admitted
	// Pod whose writable storage exceeds it.
	CellDiskBytes int64
	// RunAsUser is the non-root UID and GID of the container (default
	// DefaultRunAsUser).
	RunAsUser int64
	// NetworkPolicy, when not false, makes the provider ensure a deny-all
	// NetworkPolicy (no ingress, no egress) selecting the pool's Pods
	// before it creates any. Nil means true.
	NetworkPolicy *bool
	// ReadyTimeout bounds Provision's wait for the Pod to be Running with
	// every container ready (default DefaultReadyTimeout).
	ReadyTimeout time.Duration
	// TerminationGracePeriod is the Pod's grace period: how long the
	// kubelet gives the container to stop before killing it (default
	// DefaultTerminationGracePeriod).
	TerminationGracePeriod time.Duration
	// NodeName pins Pods to a node, bypassing the scheduler (optional;
	// tests with kwok set it).
	NodeName string
	// Identity names the provider in Capabilities (default
	// "kubernetes:<namespace>/<pool>").
	Identity string
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// AgentImage, when set, runs the cell agent (CONTRACT §13) in every
	// Pod: the image (pinned by digest, name@sha256:<64 hex>) holding the
	// static agent at AgentImageBinary. An init container copies it into
	// an emptyDir and the cell container runs it as its entrypoint, the
	// launcher of the workload; its pinned digest is the agent build
	// digest the plane expects, read back from the init container's
	// imageID. Each cell gets its own CA and leaves in two Secrets
	// (AgentSecretName, ControlSecretName), and Provider.Driver returns
	// an AgentProvider: exec, files and launch go through the agent over
	// TLS 1.3 with mutual authentication. Empty: no agent, exec through
	// pods/exec, no Secrets.
	AgentImage string
	// AgentPort is the Pod port the agent serves on (default
	// DefaultAgentPort). The pool's deny-all NetworkPolicy stays; the
	// deployment admits this port from the plane with a policy of its
	// own (deploy/kubernetes/networkpolicy.yaml).
	AgentPort int
	// CertValidity is how long a cell's certificates are valid (default
	// DefaultCertValidity).
	CertValidity time.Duration
	// DialContext dials the agents' Pod addresses (network "tcp", addr
	// "<pod IP>:<agent port>"); TLS runs over the connection it returns.
	// Set it when Pod IPs are reachable only through a proxy, a tunnel or
	// another network namespace. Nil means a net.Dialer.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
	// RecordAgentMessages, for tests only, has the agent append every
	// request it receives to a file in the cell's /tmp, which
	// AgentProvider.AgentMessages reads back through pods/exec. The cell's
	// workload can read and change that file: never set it for tenants.
	RecordAgentMessages bool
}

// Provider runs each cell as one Pod. It implements driver.Provider,
// driver.Lister and driver.Execer and is safe for concurrent use.
type Provider struct {
	cfg    Config
	client k8s.Interface
	byName map[string]lease.RuntimeClass // RuntimeClass object name → class
	log    *slog.Logger
	cpu    resource.Quantity
	memory resource.Quantity

	npMu sync.Mutex
	npOK bool

	exec *podexec.Runner

	agents  sync.Map     // cell ID → *agentEntry
	creates inflight.Set // the Pod and Secret creates of cells, for Destroy to wait out
}

var _ interface {
	driver.Provider
	driver.Lister
	driver.Execer
} = (*Provider)(nil)

var digestRef = regexp.MustCompile(`^[^@\s]+@sha256:[0-9a-f]{64}$`)

// ErrNoImage is returned (wrapped) by Provision for a request that names
// no image (driver.ProvisionRequest.Image) to a provider that has none of
// its own: the provider of an image class (Config.ImageClass), whose
// every provision must name its cell's image. Nothing is created.
var ErrNoImage = errors.New("no image: the request names none and the provider has none of its own " +
	"(an image class: every provision names its image)")

// New validates cfg, fills its defaults and returns a Provider. It does no
// I/O.
func New(cfg Config) (*Provider, error) {
	bad := func(field, rule string, args ...any) (*Provider, error) {
		return nil, fmt.Errorf("kubernetes: %s %s", field, fmt.Sprintf(rule, args...))
	}
	if cfg.Client == nil && cfg.RESTConfig == nil {
		return bad("rest_config", "is required (or a client)")
	}
	if errs := validation.IsDNS1123Label(cfg.Namespace); len(errs) > 0 {
		return bad("namespace", "%q is invalid: %s", cfg.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsValidLabelValue(cfg.Pool); cfg.Pool == "" || len(errs) > 0 {
		return bad("pool", "%q must be a non-empty Kubernetes label value: %s", cfg.Pool, strings.Join(errs, "; "))
	}
	if err := driver.CheckInstallationTag(cfg.Installation); err != nil {
		return nil, fmt.Errorf("kubernetes: %w", err)
	}
	byName, err := kubeconf.RuntimeClassIndex(cfg.RuntimeClassNames)
	if err != nil {
		return bad("runtime_class_names", "%v", err)
	}
	switch {
	case cfg.ImageClass && cfg.Image != "":
		return bad("image", "%q must be empty with image_class: an image class's every provision names its own image", cfg.Image)
	case cfg.ImageClass:
	case cfg.Image == "":
		return bad("image", "is required, pinned by digest (name@sha256:<64 hex digits>), "+
			"unless the pool is an image class (image_class true), whose every provision names its image")
	case !digestRef.MatchString(cfg.Image):
		return bad("image", "%q must be pinned by digest (name@sha256:<64 hex digits>)", cfg.Image)
	}
	if len(cfg.Command) == 0 {
		cfg.Command = slices.Clone(DefaultCommand)
	}
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&cfg.CPU, DefaultCPU)
	def(&cfg.Memory, DefaultMemory)
	p := &Provider{byName: byName}
	for _, q := range []struct {
		field string
		s     string
		dst   *resource.Quantity
	}{{"cpu", cfg.CPU, &p.cpu}, {"memory", cfg.Memory, &p.memory}} {
		if *q.dst, err = resource.ParseQuantity(q.s); err != nil || q.dst.Sign() <= 0 {
			return bad(q.field, "%q is not a positive quantity", q.s)
		}
	}
	if err := p.cellDisk(&cfg); err != nil {
		return nil, err
	}
	if cfg.AgentImage != "" {
		if !digestRef.MatchString(cfg.AgentImage) {
			return bad("agent_image", "%q must be pinned by digest (name@sha256:<64 hex digits>)", cfg.AgentImage)
		}
		if cfg.AgentPort == 0 {
			cfg.AgentPort = DefaultAgentPort
		}
		if cfg.AgentPort < 1 || cfg.AgentPort > 65535 {
			return bad("agent_port", "%d is not a TCP port", cfg.AgentPort)
		}
		if cfg.CertValidity <= 0 {
			cfg.CertValidity = DefaultCertValidity
		}
		// The agent runs commands as the cell user only by being it.
		if cfg.RunAsUser == 0 {
			cfg.RunAsUser = agent.CellUID
		}
		if cfg.RunAsUser != agent.CellUID {
			return bad("run_as_user", "must be %d (the cell user) with agent_image: the agent runs as the cell user", agent.CellUID)
		}
	}
	if cfg.RunAsUser == 0 {
		cfg.RunAsUser = DefaultRunAsUser
	}
	if cfg.RunAsUser < 0 {
		return bad("run_as_user", "must be a non-root UID")
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.TerminationGracePeriod <= 0 {
		cfg.TerminationGracePeriod = DefaultTerminationGracePeriod
	}
	if cfg.NodeName != "" {
		if errs := validation.IsDNS1123Subdomain(cfg.NodeName); len(errs) > 0 {
			return bad("node_name", "%q is invalid", cfg.NodeName)
		}
	}
	if cfg.Identity == "" {
		cfg.Identity = "kubernetes:" + cfg.Namespace + "/" + cfg.Pool
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.DialContext == nil {
		cfg.DialContext = (&net.Dialer{}).DialContext
	}
	if cfg.Client == nil {
		if cfg.Client, err = k8s.NewForConfig(cfg.RESTConfig); err != nil {
			return nil, fmt.Errorf("kubernetes: client: %w", err)
		}
	}
	p.cfg = cfg
	p.client = cfg.Client
	p.log = cfg.Logger.With("driver", "kubernetes", "namespace", cfg.Namespace, "pool", cfg.Pool)
	p.exec = &podexec.Runner{Config: cfg.RESTConfig, Namespace: cfg.Namespace, Log: p.log}
	return p, nil
}

// Capabilities implements driver.Provider.
func (p *Provider) Capabilities() driver.Capabilities {
	classes := slices.Sorted(maps.Keys(p.cfg.RuntimeClassNames))
	return driver.Capabilities{Kind: "kubernetes", Mode: driver.Apply, RuntimeClasses: classes, Identity: p.cfg.Identity,
		Images: true}
}

// PodName is the name of the Pod that backs a cell.
func PodName(cellID uuid.UUID) string { return PodNamePrefix + cellID.String() }

func (p *Provider) pods() podClient { return p.client.CoreV1().Pods(p.cfg.Namespace) }

// Provision implements driver.Provider. It ensures the pool's deny-all
// NetworkPolicy (unless disabled), creates the cell's Pod (or finds the one
// an earlier call created), reads it back from the API server and requires
// the admitted spec.runtimeClassName to be the configured name for
// req.RuntimeClass and the cell container's image to be exactly the
// requested one — a mutating admission webhook may have removed or
// changed either — and then waits, within ctx and ReadyTimeout, until the
// Pod is Running with every container ready. A mismatch returns at once
// with a *driver.VerifyError (runtime_class_boundary_unverified); the Pod
// is left for the caller's Destroy, which the pool reconciler runs at
// once.
//
// The cell container's image is req.Image when it is set — a reference
// pinned by digest, or else Provision fails (the error wraps an
// *imageref.Error) — and Config.Image otherwise; a provider without one
// (Config.ImageClass) fails a request that names none with ErrNoImage.
// Either refusal comes before anything is created. The Pod records the
// image in AnnotationImage for later read-backs.
func (p *Provider) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	if err := ctx.Err(); err != nil {
		return driver.Object{}, fmt.Errorf("kubernetes: provision: %w", err)
	}
	rcName, ok := p.cfg.RuntimeClassNames[req.RuntimeClass]
	if !ok {
		return driver.Object{}, fmt.Errorf("kubernetes: provision: runtime class %q is not configured", req.RuntimeClass)
	}
	name := PodName(req.CellID)
	image, err := p.cellImage(req)
	if err != nil {
		return driver.Object{}, fmt.Errorf("kubernetes: provision %s: %w", name, err)
	}
	if err := p.ensureNetworkPolicy(ctx); err != nil {
		return driver.Object{}, err
	}
	log := p.log.With("cell_id", req.CellID, "pod", name)
	if p.cfg.AgentImage != "" {
		// Before the Pod, which mounts the agent's Secret.
		if err := p.ensureSecrets(ctx, req.CellID, req.RuntimeClass); err != nil {
			return driver.Object{}, fmt.Errorf("kubernetes: provision %s: %w", name, err)
		}
	}

	var created *corev1.Pod
	err = p.creates.Do(ctx, req.CellID, func(ctx context.Context) (err error) {
		created, err = p.pods().Create(ctx, p.podSpec(req.CellID, req.RuntimeClass, rcName, image), metav1.CreateOptions{})
		return err
	})
	switch {
	case err == nil:
		log.Info("pod created", "uid", created.UID, "runtime_class_name", rcName, "image", image)
	case apierrors.IsAlreadyExists(err):
		// A retry: the Pod of an earlier call is this cell's object.
		if created, err = p.pods().Get(ctx, name, metav1.GetOptions{}); err != nil {
			return driver.Object{}, fmt.Errorf("kubernetes: provision %s: reading the existing pod: %w", name, err)
		}
		if err := p.owned(created, req.CellID); err != nil {
			return driver.Object{}, fmt.Errorf("kubernetes: provision %s: %w", name, err)
		}
		if created.DeletionTimestamp != nil {
			return driver.Object{}, fmt.Errorf("kubernetes: provision %s: the existing pod %s is being deleted", name, created.UID)
		}
		log.Info("pod exists", "uid", created.UID)
	default:
		return driver.Object{}, fmt.Errorf("kubernetes: provision %s: create: %w", name, err)
	}
	obj := driver.Object{CellID: req.CellID, Identity: string(created.UID)}

	// Read the admitted Pod back: the create request is not evidence.
	pod, err := p.pods().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return obj, fmt.Errorf("kubernetes: provision %s: reading back: %w", name, err)
	}
	o := p.observe(pod, image)
	if err := driver.Verify(obj, o, req.RuntimeClass); err != nil {
		log.Warn("admitted pod failed verification", "uid", pod.UID, "error", err, "detail", o.Detail)
		return obj, fmt.Errorf("kubernetes: provision %s: %w (%s)", name, err, o.Detail)
	}
	if err := p.waitReady(ctx, obj, req.RuntimeClass, image); err != nil {
		return obj, fmt.Errorf("kubernetes: provision %s: %w", name, err)
	}
	log.Info("pod ready", "uid", obj.Identity)
	return obj, nil
}

// cellImage is the image of the Pod a provision creates: req.Image,
// which must be pinned by digest, or else Config.Image; ErrNoImage when
// neither is set.
func (p *Provider) cellImage(req driver.ProvisionRequest) (string, error) {
	if req.Image == "" {
		if p.cfg.Image == "" {
			return "", ErrNoImage
		}
		return p.cfg.Image, nil
	}
	if _, err := imageref.Parse(req.Image); err != nil {
		return "", fmt.Errorf("requested %w", err)
	}
	if !digestRef.MatchString(req.Image) {
		return "", fmt.Errorf("requested %w", &imageref.Error{Ref: req.Image, Reason: "must be pinned by digest (name@sha256:<64 hex digits>)"})
	}
	return req.Image, nil
}

// waitReady polls the Pod until it is Running and ready, it can no longer
// become so, or the wait ends. The admitted runtime class, image and
// identity are checked on every read.
func (p *Provider) waitReady(ctx context.Context, obj driver.Object, class lease.RuntimeClass, image string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.ReadyTimeout)
	defer cancel()
	name := PodName(obj.CellID)
	delay := 50 * time.Millisecond
	var last driver.Observation
	for {
		pod, err := p.pods().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return fmt.Errorf("pod %s disappeared while waiting for it to be ready", obj.Identity)
		case err != nil && ctx.Err() == nil:
			p.log.Debug("waiting for pod", "pod", name, "error", err)
		case err == nil:
			last = p.observe(pod, image)
			if err := driver.Verify(obj, last, class); err != nil {
				return fmt.Errorf("%w (%s)", err, last.Detail)
			}
			if last.Ready {
				return nil
			}
			if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
				return fmt.Errorf("pod can no longer become ready: %s", last.Detail)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod not ready within %v (%s): %w", p.cfg.ReadyTimeout, last.Detail, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}

// owned checks that a Pod found under a cell's name carries this pool's
// ownership labels.
func (p *Provider) owned(pod *corev1.Pod, cellID uuid.UUID) error {
	if err := p.ownedLabels(pod.Labels, cellID); err != nil {
		return fmt.Errorf("pod %s/%s (uid %s) %w", pod.Namespace, pod.Name, pod.UID, err)
	}
	return nil
}

// ownedLabels checks an object's labels for this pool's ownership of the
// cell's object.
func (p *Provider) ownedLabels(l map[string]string, cellID uuid.UUID) error {
	if l[LabelManagedBy] != ManagedByValue || l[LabelPool] != p.cfg.Pool || l[LabelCellID] != cellID.String() {
		return fmt.Errorf("does not carry the ownership labels of pool %q", p.cfg.Pool)
	}
	return nil
}

// Inspect implements driver.Provider: it reads the Pod named after the
// cell from the API server. RuntimeClass is the class whose configured
// RuntimeClass name equals the admitted spec.runtimeClassName, and "" when
// none does, when the Pod lacks this pool's ownership labels, or when its
// admitted spec breaks the isolation the driver asked for (a privileged
// container, a host namespace, a service-account token, a cell container
// image other than the one recorded in AnnotationImage at creation — or,
// for a Pod created before that annotation, Config.Image). Ready means
// Running, not terminating, every container ready.
func (p *Provider) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	pod, err := p.pods().Get(ctx, PodName(obj.CellID), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return driver.Observation{Detail: "no pod " + PodName(obj.CellID)}, nil
	}
	if err != nil {
		return driver.Observation{}, fmt.Errorf("kubernetes: inspect %s: %w", PodName(obj.CellID), err)
	}
	return p.observe(pod, ""), nil
}

// observe turns an admitted Pod into an Observation. image is the image
// the caller asked the Pod to run (a provision's), or "" to take the one
// the Pod records (expectedImage).
func (p *Provider) observe(pod *corev1.Pod, image string) driver.Observation {
	o := driver.Observation{Exists: true, Identity: string(pod.UID)}
	rcName := ""
	if pod.Spec.RuntimeClassName != nil {
		rcName = *pod.Spec.RuntimeClassName
	}
	cellID, _ := uuid.Parse(strings.TrimPrefix(pod.Name, PodNamePrefix))
	var problems []string
	if err := p.owned(pod, cellID); err != nil {
		problems = append(problems, err.Error())
	}
	if class, ok := p.byName[rcName]; ok {
		o.RuntimeClass = class
	} else if rcName == "" {
		problems = append(problems, "admitted pod has no runtimeClassName")
	} else {
		problems = append(problems, fmt.Sprintf("admitted runtimeClassName %q is not configured", rcName))
	}
	problems = append(problems, p.weakened(pod, image)...)
	if why := p.unboundedDisk(pod); why != "" {
		problems = append(problems, why)
	}
	if len(problems) > 0 {
		o.RuntimeClass = ""
	}
	o.Ready = kubeconf.PodReady(pod)
	o.ImageDigest = admittedImage(pod)
	if p.cfg.AgentImage != "" {
		o.AgentDigest = admittedAgent(pod)
	}
	phase := string(pod.Status.Phase)
	if pod.DeletionTimestamp != nil {
		phase += ", terminating"
	}
	o.Detail = fmt.Sprintf("pod %s/%s uid %s runtimeClassName %q phase %s ready %v", pod.Namespace, pod.Name, pod.UID, rcName, phase, o.Ready)
	if len(problems) > 0 {
		o.Detail += ": " + strings.Join(problems, "; ")
	}
	return o
}

// admittedImage is the repo digest the kubelet reports the cell
// container runs (status.containerStatuses[].imageID, "repo@sha256:<hex>",
// possibly behind a "docker-pullable://" scheme), or "" when it reports
// none or only a local image ID: locally imported images carry no repo
// digest. The plane compares it with the pool's pinned digest (CONTRACT
// §15).
func admittedImage(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != ContainerName {
			continue
		}
		return driver.RepoDigest(cs.ImageID)
	}
	return ""
}

// expectedImage is the image the admitted Pod's cell container must run,
// and what is wrong with the Pod's record of it. The record is
// AnnotationImage, written at creation by the driver (the cell holds no
// credential to change its Pod); a Pod without it was created before
// per-cell images and expects Config.Image. With want (the image a
// provision asked for) the record must equal it too, and want is
// expected: what the plane asked is the authority, so admission that
// rewrote both the image and the record is caught at provisioning, and
// afterwards by the plane's comparison of the kubelet's digest with the
// cell's pinned one.
func (p *Provider) expectedImage(pod *corev1.Pod, want string) (string, []string) {
	var out []string
	rec, ok := pod.Annotations[AnnotationImage]
	switch {
	case !ok && p.cfg.Image == "":
		out = append(out, "admitted pod records no image ("+AnnotationImage+") and the provider has none")
	case !ok:
		rec = p.cfg.Image
	case !digestRef.MatchString(rec):
		out = append(out, fmt.Sprintf("admitted pod records image %q, which is not pinned by digest", rec))
	}
	if want == "" {
		return rec, out
	}
	if rec != want {
		out = append(out, fmt.Sprintf("admitted pod records image %q, not the requested %q", rec, want))
	}
	return want, out
}

// weakened lists what in the admitted Pod breaks the isolation the driver
// asked for: admission may have added it. image is as for observe.
func (p *Provider) weakened(pod *corev1.Pod, image string) []string {
	image, out := p.expectedImage(pod, image)
	s := pod.Spec
	if s.HostNetwork || s.HostPID || s.HostIPC {
		out = append(out, "admitted pod shares a host namespace")
	}
	if s.AutomountServiceAccountToken == nil || *s.AutomountServiceAccountToken {
		out = append(out, "admitted pod mounts a service-account token")
	}
	found := false
	all := slices.Concat(s.InitContainers, s.Containers)
	for _, c := range all {
		if sc := c.SecurityContext; sc != nil && ((sc.Privileged != nil && *sc.Privileged) ||
			(sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation)) {
			out = append(out, fmt.Sprintf("admitted container %q is privileged or may escalate", c.Name))
		}
		if c.Name == ContainerName {
			found = true
			if image == "" || c.Image != image {
				out = append(out, fmt.Sprintf("admitted image %q is not the image the pod was created with (%q)", c.Image, image))
			}
		}
	}
	if p.cfg.AgentImage != "" {
		i := slices.IndexFunc(s.InitContainers, func(c corev1.Container) bool { return c.Name == AgentInitContainerName })
		switch {
		case i < 0:
			out = append(out, "admitted pod has no "+AgentInitContainerName+" init container")
		case s.InitContainers[i].Image != p.cfg.AgentImage:
			out = append(out, fmt.Sprintf("admitted agent image %q is not the configured agent image", s.InitContainers[i].Image))
		}
	}
	for _, c := range s.EphemeralContainers {
		out = append(out, fmt.Sprintf("admitted pod has ephemeral container %q", c.Name))
	}
	if !found {
		out = append(out, "admitted pod has no "+ContainerName+" container")
	}
	return out
}

// Destroy implements driver.Provider. It deletes the Pod with a UID
// precondition (so a later Pod reusing the name is never deleted in its
// place) and then reads the name back until the API server says the Pod
// does not exist, or that the name now belongs to another UID. Deletion is
// graceful: on a real cluster the API server removes the Pod only after
// the kubelet reported its containers stopped, so absence of the Pod object
// is absence of the runtime. A timeout, an error, or a Pod still
// terminating when ctx ends is returned wrapping driver.ErrUncertain,
// never as proof.
//
// An empty obj.Identity names whatever Pod backs the cell, if it carries
// this pool's ownership labels.
//
// With the agent (Config.AgentImage), the cell's Secrets are deleted once
// the Pod is gone and their absence is part of the proof: a Secret still
// present is driver.ErrUncertain too. They are left while another Pod
// holds the cell's name (they are its Secrets then).
func (p *Provider) Destroy(ctx context.Context, obj driver.Object) error {
	if err := p.creates.Wait(ctx, obj.CellID); err != nil {
		return fmt.Errorf("kubernetes: destroy %s: %w: %v", PodName(obj.CellID), driver.ErrUncertain, err)
	}
	if err := p.destroyPod(ctx, obj); err != nil || p.cfg.AgentImage == "" {
		return err
	}
	p.dropAgent(obj.CellID)
	name := PodName(obj.CellID)
	uncertain := func(format string, args ...any) error {
		return fmt.Errorf("kubernetes: destroy %s: %w: %s", name, driver.ErrUncertain, fmt.Sprintf(format, args...))
	}
	pod, err := p.pods().Get(ctx, name, metav1.GetOptions{})
	switch {
	case err == nil:
		p.log.Info("another pod holds the cell's name; keeping its secrets", "cell_id", obj.CellID, "uid", pod.UID)
		return nil
	case !apierrors.IsNotFound(err):
		return uncertain("reading the pod: %v", err)
	}
	if err := p.destroySecrets(ctx, obj.CellID); err != nil {
		return uncertain("%v", err)
	}
	return nil
}

// destroyPod is Destroy's proven deletion of the Pod.
func (p *Provider) destroyPod(ctx context.Context, obj driver.Object) error {
	name := PodName(obj.CellID)
	uncertain := func(format string, args ...any) error {
		return fmt.Errorf("kubernetes: destroy %s: %w: %s", name, driver.ErrUncertain, fmt.Sprintf(format, args...))
	}
	pod, err := p.pods().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return uncertain("reading the pod: %v", err)
	case obj.Identity != "" && string(pod.UID) != obj.Identity:
		return nil // the name belongs to another object: ours is gone
	}
	if obj.Identity == "" {
		// Not named by the UID we created: delete it only if it is ours.
		if err := p.owned(pod, obj.CellID); err != nil {
			return uncertain("%v; not deleting it", err)
		}
	}
	uid := pod.UID
	log := p.log.With("cell_id", obj.CellID, "pod", name, "uid", uid)
	if pod.DeletionTimestamp == nil {
		err = p.pods().Delete(ctx, name, metav1.DeleteOptions{
			Preconditions:     &metav1.Preconditions{UID: &uid},
			PropagationPolicy: ptr(metav1.DeletePropagationBackground),
		})
		switch {
		case err == nil:
			log.Info("pod delete accepted")
		case apierrors.IsNotFound(err):
			return nil
		case apierrors.IsConflict(err):
			// The UID precondition failed: the name is another Pod's now
			// (confirmed by the read below), or the API server is confused.
		default:
			return uncertain("delete: %v", err)
		}
	}
	return p.waitGone(ctx, name, uid, uncertain)
}

// waitGone polls until the Pod named name with uid is absent, or ctx ends.
func (p *Provider) waitGone(ctx context.Context, name string, uid types.UID, uncertain func(string, ...any) error) error {
	delay := 50 * time.Millisecond
	var last string
	for {
		pod, err := p.pods().Get(ctx, name, metav1.GetOptions{})
		switch {
		case apierrors.IsNotFound(err):
			return nil
		case err != nil:
			last = err.Error()
		case pod.UID != uid:
			return nil
		default:
			last = "pod still exists"
			if pod.DeletionTimestamp != nil {
				last = fmt.Sprintf("pod still terminating (deletion requested %s, finalizers %v)",
					pod.DeletionTimestamp.UTC().Format(time.RFC3339), pod.Finalizers)
			}
		}
		select {
		case <-ctx.Done():
			return uncertain("absence of uid %s not confirmed: %s (%v)", uid, last, ctx.Err())
		case <-time.After(delay):
		}
		delay = min(delay*2, time.Second)
	}
}

// List implements driver.Lister: every Pod of this pool, found by its
// ownership labels, terminating ones included.
func (p *Provider) List(ctx context.Context) ([]driver.Object, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedByValue, LabelPool: p.cfg.Pool,
		LabelInstallation: p.cfg.Installation}).String()
	var out []driver.Object
	opts := metav1.ListOptions{LabelSelector: sel}
	for {
		list, err := p.pods().List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("kubernetes: list: %w", err)
		}
		for _, pod := range list.Items {
			id, err := uuid.Parse(pod.Labels[LabelCellID])
			if err != nil || pod.Name != PodName(id) {
				p.log.Warn("pod with ownership labels but no matching cell id", "pod", pod.Name)
				continue
			}
			out = append(out, driver.Object{CellID: id, Identity: string(pod.UID)})
		}
		if list.Continue == "" {
			break
		}
		opts.Continue = list.Continue
	}
	if p.cfg.AgentImage != "" {
		// A cell whose Pod is gone (or was never created) but whose
		// Secrets remain is an object too: Destroy removes them.
		var err error
		if out, err = p.listSecrets(ctx, sel, out); err != nil {
			return nil, err
		}
	}
	slices.SortFunc(out, func(a, b driver.Object) int { return strings.Compare(a.CellID.String(), b.CellID.String()) })
	return out, nil
}

func ptr[T any](v T) *T { return &v }
