// Package driver defines what a provider of sterile cells must do, and no
// more: create an object for a cell ID, report what the provider actually
// admitted, destroy the object with proof, and optionally list objects and
// run commands. Everything else — fences, states, verification against the
// signed runtime class, retries — lives once in the plane and the pool
// reconciler.
//
// Start with [Provider]: Capabilities, Provision, Inspect and Destroy, each
// method's contract in its doc comment. [Lister] (orphan reconciliation),
// [Execer] (commands) and [AgentHost] (the cell agent) are optional
// abilities the plane detects, and so is [ImageCache] (an image cache
// the plane prefetches into). The plane checks what Inspect reports with
// [Verify], and a Destroy that cannot prove deletion returns
// [ErrUncertain]. driver/drivertest's Example_customProvider is a complete
// driver proven by drivertest.Run.
//
// A driver speaks only to its provider. It never imports the root package,
// a store, or another driver.
package driver

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Provider is the interface every driver implements. Implementations must
// be safe for concurrent use; calls for different cells may run in parallel.
type Provider interface {
	// Capabilities reports what the provider is. It does no I/O.
	Capabilities() Capabilities

	// Provision creates the object for req.CellID and waits, within ctx,
	// until it is ready. It is idempotent per cell ID: when the object
	// already exists (a retry after a crash or a lost response) it returns
	// that object instead of creating a second one. The returned object's
	// Identity is what Inspect must report for the same object.
	Provision(ctx context.Context, req ProvisionRequest) (Object, error)

	// Inspect reads the object back from the provider. A missing object is
	// an Observation with Exists false, not an error; an error means the
	// provider could not be asked.
	Inspect(ctx context.Context, obj Object) (Observation, error)

	// Destroy deletes the object and returns nil only with proof that the
	// exact object is absent: the provider says it does not exist, or that
	// the name now belongs to another identity. Destroying an absent object
	// returns nil. Anything less — a timeout, an error, a delete accepted
	// but not yet confirmed — is returned as an error (see ErrUncertain),
	// and the plane keeps the cell quarantined and counted until a later
	// Destroy proves it.
	Destroy(ctx context.Context, obj Object) error
}

// Mode says whether a provider creates real isolation boundaries.
type Mode string

// Provider modes.
const (
	// Apply providers create real objects: a verified observation is
	// evidence that the runtime exists.
	Apply Mode = "apply"
	// DryRun providers simulate the whole life cycle. A dry-run result is
	// never evidence that a runtime existed; every report says dry_run.
	DryRun Mode = "dry_run"
)

// Capabilities describe a provider.
type Capabilities struct {
	// Kind names the provider ("gvisor", "kubernetes", "dry-run", …).
	Kind string
	// Mode is Apply or DryRun.
	Mode Mode
	// RuntimeClasses lists the classes the provider can serve.
	RuntimeClasses []lease.RuntimeClass
	// Identity is the provider identity that owns pool cells, reported as
	// the cells' worker_id (e.g. "gvisor:hostname").
	Identity string
	// Images reports that the provider provisions a cell of any image
	// pinned by digest that a request names (ProvisionRequest.Image), as
	// an image class needs (CONTRACT §21). A provider whose cell image the
	// plane does not choose (agent-sandbox templates) reports false, and
	// its pools refuse images at start-up.
	Images bool
	// Egress reports that the provider enforces an egress allow-list
	// outside its cells (ProvisionRequest.Egress; CONTRACT §22). A pool
	// with an allow-list needs such a provider, else it is refused at
	// start-up: a cell never gets more network than its provider can
	// hold to the list.
	Egress bool
}

// EgressEnforcer is implemented by every provider whose Capabilities report
// Egress (CONTRACT §22). SetEgress holds a cell to policy p from now on:
// the narrower policy of the claim that leased it, never a wider one than
// it was provisioned with (the plane checks that). EgressCounts returns
// how many of the cell's connections were allowed and refused, by the
// host they named ("-" for one that named none); a provider keeps them
// for a while after the cell is destroyed, and nil means none are known.
type EgressEnforcer interface {
	SetEgress(ctx context.Context, obj Object, p egress.Policy) error
	EgressCounts(obj Object) map[string]EgressCount
}

// EgressCount is how many connections of a cell to one host were allowed
// and refused.
type EgressCount struct{ Allowed, Refused int }

// Object names one provider object: the cell it backs and the identity the
// provider gave it (a container ID, a Pod UID…). Identity distinguishes the
// object from a later one that reuses the same name. An empty Identity (a
// provision that failed before its identity was recorded) names whatever
// object backs the cell ID.
type Object struct {
	CellID   uuid.UUID
	Identity string
}

// ErrImageUnsupported is returned (wrapped) by Provision, before it
// creates anything, for a request that names an image
// (ProvisionRequest.Image) when the provider does not report
// Capabilities.Images.
var ErrImageUnsupported = errors.New("the provider cannot make a cell of a requested image (it serves no image class, CONTRACT §21)")

// ImageCache is implemented by providers that keep the images of their
// cells in a cache on the host, shared with other providers (the gVisor
// driver's image cache, CONTRACT §15, §21): the plane prefetches images
// into it (POST /v1/images/prefetch), lists it, and reports its bytes and
// evictions as installation-wide metrics. Providers whose images another
// system pulls (a kubelet) do not implement it.
type ImageCache interface {
	// Prefetch makes sure image, an OCI reference pinned by digest, is
	// in the cache, pulling it when it is not, within ctx, under the
	// rules of a provision's pull: it never exceeds the cache's budget
	// and never evicts an image a live cell uses. An image the budget has
	// no room for is an error that errors.Is ErrImageCacheFull. A cached
	// image is not pulled again; a prefetch marks it used now.
	Prefetch(ctx context.Context, image string) error
	// CachedImages lists the complete images of the cache, of every
	// provider, pool and installation that shares it.
	CachedImages(ctx context.Context) ([]CachedImage, error)
	// CacheStats reports the bytes the cache's images take, the whole
	// cache's (every provider sharing it reports the same figure), and
	// how many images this provider evicted from it to keep within its
	// budget since it was made.
	CacheStats(ctx context.Context) (bytes int64, evictions uint64, err error)
	// CacheID names the cache: providers that report one ID share one
	// cache (the gVisor driver's absolute cache directory), so its bytes
	// are counted once. It does no I/O.
	CacheID() string
}

// CachedImage is one complete image of an ImageCache.
type CachedImage struct {
	// Digest is the image's digest, "sha256:<hex>".
	Digest string
	// Reference is the reference pinned by that digest the image was
	// pulled by; "" when the cache did not record it.
	Reference string
	// Bytes is what the image takes in the cache, as its budget counts
	// it.
	Bytes int64
	// LastUsed is the image's last use (a provision or a prefetch), or
	// when it was cached.
	LastUsed time.Time
}

// ErrImageCacheFull is matched (errors.Is) by the error of a pull that an
// image cache's budget has no room for, even after evicting every image
// it may evict: the rest is held by images live cells use, pools
// reference, or pulls in flight reserved. Nothing of the image is left
// in the cache; room is made by cells that end. A prefetch reports it as
// failed with code insufficient_storage.
var ErrImageCacheFull = errors.New("the image cache's budget has no room for the image")

// ProvisionRequest asks for one object.
type ProvisionRequest struct {
	CellID       uuid.UUID
	RuntimeClass lease.RuntimeClass
	// Image is the cell's image, an OCI reference pinned by digest
	// ("host/repo@sha256:<hex>"), for a cell of an image class (CONTRACT
	// §21); "" means the provider's own configured image, if any. Only a
	// provider whose Capabilities report Images is given one. The provider
	// fetches it (from its content-addressed cache when it is there,
	// never resolving a tag) within the call's context, and reports the
	// digest it admitted in Observation.ImageDigest.
	Image string
	// Egress is the cell's egress policy (CONTRACT §22): its pool's.
	// egress.None, the default, is loopback only. Only a provider whose
	// Capabilities report Egress is given another, which it enforces
	// outside the cell; a claim may narrow it later, never widen it.
	Egress egress.Policy
}

// Observation is what the provider reports about an object when asked
// afresh — never what the driver asked for.
type Observation struct {
	// Exists is false when the provider has no object of that name.
	Exists bool
	// Identity is the identity of the object found under the cell's name.
	Identity string
	// RuntimeClass is the class the provider demonstrably admitted the
	// object with, or "" when it cannot be shown.
	RuntimeClass lease.RuntimeClass
	// Ready reports that the object can run commands now.
	Ready bool
	// AgentDigest is the build digest ("sha256:<hex>") of the cell agent
	// the provider mounted into this object, read back from the provider
	// (the bundle, the Pod spec), or "" when the object runs no agent. The
	// plane expects the agent to report exactly this digest.
	AgentDigest string
	// ImageDigest is the digest ("sha256:<hex>") of the image the provider
	// read back as mounted or pulled for this object (the content the
	// runtime actually serves, not the request), or "" when the object
	// runs no pinned image. The plane requires exactly the pool's pinned
	// digest (CONTRACT §15).
	ImageDigest string
	// Detail explains the observation for logs (never a secret).
	Detail string
}

// Lister is implemented by providers that can enumerate their objects, so
// the reconciler can destroy orphans left by a crash.
type Lister interface {
	// List returns every object the provider holds for this pool.
	List(ctx context.Context) ([]Object, error)
}

// Preparer is implemented by providers that must fetch something once
// before they can provision, such as a pool's image. The reconciler calls
// Prepare before it creates members, never on a claim's path, and creates
// none while it fails: the error is the pool's last_error. Prepare must
// be cheap once it succeeded, and pace its own retries (a call during a
// back-off returns the last error at once).
type Preparer interface {
	Prepare(ctx context.Context) error
}

// PinnedDigest returns the digest ("sha256:<64 hex>") an image reference
// is pinned by ("host/repo@sha256:…" or "host/repo:tag@sha256:…"), and
// false when it is not pinned by a SHA-256 digest. It checks the digest
// only; the command that reads the configuration checks the whole
// reference.
func PinnedDigest(ref string) (string, bool) {
	i := strings.LastIndexByte(ref, '@')
	if i <= 0 {
		return "", false
	}
	d := ref[i+1:]
	hexPart, ok := strings.CutPrefix(d, "sha256:")
	if !ok || len(hexPart) != 64 || strings.Trim(hexPart, "0123456789abcdef") != "" {
		return "", false
	}
	return d, true
}

// RepoDigest returns the digest of a container runtime's image ID when it
// is a repo digest ("repo@sha256:<hex>", also behind a scheme such as
// "docker-pullable://"), as the kubelet reports in
// status.containerStatuses[].imageID for an image it pulled; "" for a
// bare local image ID ("sha256:<hex>" of an imported image carries no
// repo digest) or anything else.
func RepoDigest(imageID string) string {
	if _, rest, ok := strings.Cut(imageID, "://"); ok {
		imageID = rest
	}
	if !strings.Contains(imageID, "@") {
		return ""
	}
	d, _ := PinnedDigest(imageID)
	return d
}

// Execer is implemented by providers that can run a command in a cell.
type Execer interface {
	// Exec runs one command in the object and waits for it, within ctx and
	// req.Timeout. A command that ran and exited non-zero is not an error.
	Exec(ctx context.Context, obj Object, req ExecRequest) (ExecResult, error)
}

// AgentHost is implemented by providers whose cells run the cell agent
// (package agent, CONTRACT §13). The plane reads the agent's status at
// admission and verification, activates it with a sanitized activation on
// the first lease operation, and routes exec, files and launch through it;
// Execer remains only for providers without an agent.
type AgentHost interface {
	// Agent returns a connection to obj's agent over the channel only the
	// provider's control side can open. It may be called for every
	// request; a driver caches what is worth caching. A missing object is
	// ErrNotFound.
	Agent(ctx context.Context, obj Object) (agent.Conn, error)
}

// ExecRequest is one command.
type ExecRequest struct {
	Argv  []string
	Stdin []byte
	Env   map[string]string
	// Timeout bounds the command; the driver kills it, and everything it
	// started, when it expires. A killed command reports TimedOut and a
	// non-zero exit code. Zero means DefaultExecTimeout.
	Timeout time.Duration
	// MaxOutput caps each of stdout and stderr, in bytes; zero means
	// agent.DefaultMaxOutput.
	MaxOutput int
}

// DefaultExecTimeout is the timeout of an ExecRequest whose Timeout is
// zero. (The default output cap is agent.DefaultMaxOutput.)
const DefaultExecTimeout = 60 * time.Second

// Limits returns the request's timeout and output cap, defaults applied.
func (r ExecRequest) Limits() (time.Duration, int) {
	timeout, maxOut := r.Timeout, r.MaxOutput
	if timeout <= 0 {
		timeout = DefaultExecTimeout
	}
	if maxOut <= 0 {
		maxOut = agent.DefaultMaxOutput
	}
	return timeout, maxOut
}

// ExecResult is a finished command.
type ExecResult struct {
	ExitCode       int
	Stdout, Stderr []byte
	// Truncated reports that stdout or stderr hit MaxOutput.
	Truncated bool
	// TimedOut reports that the command was killed at its timeout.
	TimedOut bool
	// Signal names the signal that ended the command ("KILL"), or "".
	Signal string
	// Reason says how the command ended (agent.Exited, agent.TimedOut,
	// agent.Killed; agent.CellLost only on the wire, never with a nil
	// error from a driver).
	Reason   agent.Reason
	Duration time.Duration
}

// ErrUncertain marks a destroy whose outcome could not be proven. Drivers
// wrap it with the detail of what was observed.
var ErrUncertain = errors.New("deletion not proven")

// ErrCellLost is returned (wrapped) by Exec when the object died during the
// command (its sandbox crashed, or was killed for exceeding a limit). The
// cell is unusable: the plane quarantines it and the pool destroys it.
var ErrCellLost = errors.New("the cell died during the command")

// ErrNotFound is returned by Exec when the object does not exist.
var ErrNotFound = errors.New("provider object not found")

// Verify compares an observation of obj with the runtime class a release
// was signed for. It returns nil only when the object exists under the
// identity recorded at provisioning and the provider demonstrably admitted
// it with exactly that class.
func Verify(obj Object, o Observation, class lease.RuntimeClass) error {
	switch {
	case !o.Exists:
		return &VerifyError{Reason: "object does not exist"}
	case o.Identity != obj.Identity:
		return &VerifyError{Reason: "object identity changed from " + obj.Identity + " to " + o.Identity}
	case o.RuntimeClass != class:
		got := string(o.RuntimeClass)
		if got == "" {
			got = "none"
		}
		return &VerifyError{Reason: "admitted runtime class is " + got + ", signed class is " + string(class)}
	}
	return nil
}

// VerifyError is a failed runtime verification:
// runtime_class_boundary_unverified on the wire.
type VerifyError struct{ Reason string }

func (e *VerifyError) Error() string { return "runtime class boundary unverified: " + e.Reason }
