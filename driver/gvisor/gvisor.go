package gvisor

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/internal/imageref"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Defaults of Config.
const (
	DefaultPool             = "default"
	DefaultNetwork          = "none"
	DefaultMemoryLimitBytes = 512 << 20
	DefaultCPUs             = 1.0
	DefaultPidsLimit        = 1024
)

// Config configures a Provider. The zero value works: runsc from PATH,
// private directories under os.TempDir(), the default root filesystem, no
// network.
type Config struct {
	// RunscPath is the runsc binary; default FindRunsc(): the pinned build
	// (RunscVersion) when cached, else "runsc" from PATH.
	RunscPath string
	// StateDir is runsc's private --root, created 0700. Default
	// os.TempDir()/sandboxwich-runsc-<uid>. Providers that share a StateDir
	// and a Pool see the same containers (a restarted process finds the
	// containers of the one before it).
	StateDir string
	// BundleDir holds the per-cell OCI bundles and the default root
	// filesystem's skeleton, created 0700. Default
	// os.TempDir()/sandboxwich-bundles-<uid>.
	BundleDir string
	// RootFS is an operator-provided root filesystem directory, shown
	// read-only to every cell. It needs /bin/sh, sleep and uname. "" uses
	// the default root filesystem described in the package documentation.
	// It may never be the host's "/".
	RootFS string
	// Network is "none" (default: loopback only) or "sandbox" (gVisor's
	// network stack over the interfaces of the network namespace the
	// driver runs in; runsc refuses it in the host's root namespace).
	// With Egress it is "sandbox", over each cell's own namespace.
	Network string
	// Egress, when set, gives every cell a network namespace of its own
	// routed only to the egress gateway, holding the cell to its pool's
	// egress allow-list (driver.ProvisionRequest.Egress; CONTRACT §22),
	// and makes the provider report Capabilities.Egress.
	Egress *EgressNet
	// Platform is runsc's --platform ("ptrace", "kvm", "systrap"); ""
	// leaves runsc's default (systrap in the pinned runsc).
	Platform string
	// MemoryLimitBytes is each cell's memory limit; default 512 MiB.
	MemoryLimitBytes int64
	// CellDiskBytes is the size of each cell's writable storage (the pool
	// key cell_disk_bytes, CONTRACT §25): /home/cell, /tmp, /var/tmp,
	// /dev/shm and, with Image, the root's writable layer together, split
	// as "Disk" in the package documentation says. They live in the
	// cell's memory, so it must be below MemoryLimitBytes (else New fails
	// with an *CellDiskError naming the key); default half of it, at least
	// MinCellDiskBytes. A full one is ENOSPC in the cell, which lives.
	CellDiskBytes int64
	// CPUs is each cell's CPU limit in cores; default 1.
	CPUs float64
	// PidsLimit caps the host tasks (processes and threads) of each cell's
	// sandbox, the sentry's own included; default DefaultPidsLimit, at
	// least MinPidsLimit. See "Limits" in the package documentation.
	PidsLimit int64
	// Pool names the pool. It is recorded in every container's spec
	// (annotation dev.sandboxwich.pool), and List returns only this pool's
	// containers. [A-Za-z0-9_.-], at most 64 characters; default
	// "default".
	Pool string
	// AgentPath is the static cell agent binary (cmd/sandboxwich-agent)
	// mounted into every cell as its init; setting agent_path. Default: a
	// sandboxwich-agent next to the running executable, else one built
	// with the Go toolchain from the module's source (development builds)
	// or the running release's version. The file is copied into a
	// content-addressed cache and the copy is mounted; see "The cell
	// agent" in the package documentation.
	AgentPath string
	// RecordAgentMessages is for tests only: every cell's agent appends
	// every message it receives to a file in the cell's host directory,
	// which Provider.AgentMessages reads, so a test can prove that no
	// secret ever reached a cell. Never set it in production: the file
	// grows with every request and holds whatever was sent.
	RecordAgentMessages bool
	// Image is the pool's cell image, an OCI reference pinned by digest
	// ("host/repo@sha256:<hex>"; setting image, the pool's key image).
	// The driver pulls it once into ImageCacheDir (Prepare, never on a
	// claim) and the root of every cell provisioned without an image of
	// its own (ProvisionRequest.Image) is that image, read-only and
	// shared, under a private writable layer in the cell's memory.
	// Exclusive with RootFS. See "Cell images" in the package
	// documentation.
	Image string
	// ImageCacheDir is the content-addressed image cache; setting
	// image_cache_dir. Default os.UserCacheDir()/sandboxwich/images (or
	// image-cache under BundleDir without a user cache directory), with
	// or without Image: cells of an image of their own use it too.
	// Installations and pools sharing it share unpacked images.
	ImageCacheDir string
	// ImageCacheBytes is the budget of ImageCacheDir, in bytes: its
	// unpacked images together, as they take on disk (setting
	// image_cache_bytes, SANDBOXWICH_GVISOR_IMAGE_CACHE_BYTES; CONTRACT
	// §21). Before a pull and after it, the least recently used images
	// that no live cell of any installation uses and no pool references
	// are evicted until the cache fits; an image in use is never evicted,
	// and a pull that cannot fit fails with an *ImageCacheFullError,
	// leaving nothing behind. 0, the default, is unbounded. Providers
	// sharing the directory should share the budget: each enforces its
	// own.
	ImageCacheBytes int64
	// RegistryAuthFile is a Docker config.json whose auths hold the
	// registry's credentials; setting registry_auth_file. "" pulls
	// anonymously. Credentials never reach a cell, its argv or env.
	RegistryAuthFile string
	// ImageMaxBytes bounds what one pull of an image writes to the host's
	// disk: the layers' compressed blobs together, and the regular files
	// they unpack to together; setting image_max_bytes, default
	// DefaultImageMaxBytes. A larger image (a decompression bomb among
	// them) fails its pull, and the pool reports it in last_error. A copy
	// another pool or installation already unpacked is used as it is: its
	// digest names the same content.
	ImageMaxBytes int64
	// Installation is the plane's installation tag,
	// driver.InstallationTag(store.Installation): required. Container IDs
	// are "sbw-<installation>-<cell>", and List returns only containers
	// of this installation, so planes sharing a host and a StateDir never
	// see each other's cells.
	Installation string
	// Logger receives the driver's logs; default slog.Default().
	Logger *slog.Logger
}

// Provider runs sterile cells as runsc (gVisor) containers on this host.
// It implements driver.Provider, driver.Lister, driver.AgentHost,
// driver.Preparer and driver.ImageCache, and is safe for concurrent use.
type Provider struct {
	cfg        Config
	r          *runsc
	log        *slog.Logger
	agent      agentBinary // mounted into every cell
	identity   string
	rootfs     string     // root.path of every cell without an image
	hostMounts []ociMount // read-only host directories of the default rootfs
	hostKernel string     // the host's kernel release
	procRoot   string     // the host's /proc
	locks      keyedMutex
	// verified holds the identities whose kernel was checked from inside.
	verified sync.Map
	// agents caches one agent client per identity (*agent.Client).
	agents sync.Map
	// images is the image cache, and the state of each image a cell of
	// this provider was made of.
	images *imageCache
	// image is images' entry of Config.Image, the image of every cell
	// provisioned without one of its own; nil without Config.Image.
	image *imageStore
	// gofers caches the host pid of each container identity's gofer.
	gofers sync.Map
}

var (
	_ driver.Provider   = (*Provider)(nil)
	_ driver.Lister     = (*Provider)(nil)
	_ driver.AgentHost  = (*Provider)(nil)
	_ driver.Preparer   = (*Provider)(nil)
	_ driver.ImageCache = (*Provider)(nil)
)

var poolRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// New checks that runsc works, prepares the private directories and the
// root filesystem, and returns a Provider. It does not touch containers.
func New(cfg Config) (*Provider, error) {
	if cfg.Pool == "" {
		cfg.Pool = DefaultPool
	}
	if !poolRE.MatchString(cfg.Pool) {
		return nil, fmt.Errorf("gvisor: pool %q: want 1-64 characters of [A-Za-z0-9_.-]", cfg.Pool)
	}
	if err := driver.CheckInstallationTag(cfg.Installation); err != nil {
		return nil, fmt.Errorf("gvisor: %w", err)
	}
	if cfg.Network == "" {
		cfg.Network = DefaultNetwork
		if cfg.Egress != nil {
			cfg.Network = "sandbox"
		}
	}
	if cfg.Egress != nil && cfg.Network != "sandbox" {
		return nil, fmt.Errorf("gvisor: network %q: a provider with an egress net runs its cells with sandbox", cfg.Network)
	}
	if cfg.Network != "none" && cfg.Network != "sandbox" {
		return nil, fmt.Errorf("gvisor: network %q: want none or sandbox", cfg.Network)
	}
	switch cfg.Platform {
	case "", "ptrace", "kvm", "systrap":
	default:
		return nil, fmt.Errorf("gvisor: platform %q: want ptrace, kvm or systrap", cfg.Platform)
	}
	if cfg.Image != "" {
		if cfg.RootFS != "" {
			return nil, errors.New("gvisor: settings image and rootfs exclude each other")
		}
		if _, err := imageref.Parse(cfg.Image); err != nil {
			return nil, fmt.Errorf("gvisor: setting image: %w", err)
		}
	}
	if cfg.RegistryAuthFile != "" {
		if _, err := fileKeychain(cfg.RegistryAuthFile); err != nil {
			return nil, fmt.Errorf("gvisor: setting registry_auth_file: %w", err)
		}
	}
	if cfg.ImageCacheBytes < 0 {
		return nil, fmt.Errorf("gvisor: setting %s: %d is negative", imageCacheBytesSetting, cfg.ImageCacheBytes)
	}
	if cfg.MemoryLimitBytes < 0 || cfg.CPUs < 0 {
		return nil, errors.New("gvisor: negative memory or CPU limit")
	}
	if cfg.MemoryLimitBytes == 0 {
		cfg.MemoryLimitBytes = DefaultMemoryLimitBytes
	}
	if cfg.CPUs == 0 {
		cfg.CPUs = DefaultCPUs
	}
	if err := cfg.defaultCellDisk(); err != nil {
		return nil, err
	}
	if err := cfg.defaultPidsLimit(); err != nil {
		return nil, err
	}
	if cfg.CPUs < 0.01 {
		return nil, fmt.Errorf("gvisor: CPU limit %v is below 0.01", cfg.CPUs)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	uid := os.Getuid()
	if cfg.StateDir == "" {
		cfg.StateDir = filepath.Join(os.TempDir(), fmt.Sprintf("sandboxwich-runsc-%d", uid))
	}
	if cfg.BundleDir == "" {
		cfg.BundleDir = filepath.Join(os.TempDir(), fmt.Sprintf("sandboxwich-bundles-%d", uid))
	}
	var err error
	if cfg.StateDir, err = privateDir(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("gvisor: state dir: %w", err)
	}
	if cfg.BundleDir, err = privateDir(cfg.BundleDir); err != nil {
		return nil, fmt.Errorf("gvisor: bundle dir: %w", err)
	}

	path, err := lookRunsc(cfg.RunscPath)
	if err != nil {
		return nil, err
	}
	cfg.RunscPath = path

	p := &Provider{
		cfg:      cfg,
		r:        &runsc{path: path, root: cfg.StateDir, network: cfg.Network, platform: cfg.Platform},
		log:      cfg.Logger.With("driver", "gvisor", "pool", cfg.Pool),
		procRoot: "/proc",
	}
	host, err := os.Hostname()
	if err != nil {
		return nil, fmt.Errorf("gvisor: hostname: %w", err)
	}
	p.identity = "gvisor:" + host
	if p.agent, err = resolveAgent(cfg.AgentPath, agentCacheDir(cfg.BundleDir), p.log); err != nil {
		return nil, err
	}
	if p.hostKernel, err = hostKernelRelease(); err != nil {
		return nil, fmt.Errorf("gvisor: host kernel release: %w", err)
	}

	if cfg.ImageCacheDir == "" {
		cfg.ImageCacheDir = imageCacheDir(cfg.BundleDir)
	}
	p.cfg.ImageCacheDir = cfg.ImageCacheDir
	if p.images, err = newImageCache(cfg.ImageCacheDir, cfg.RegistryAuthFile, cfg.ImageMaxBytes, cfg.ImageCacheBytes,
		cfg.Installation+"-"+cfg.Pool, cfg.StateDir, p.log); err != nil {
		return nil, err
	}
	p.images.inUse = p.imagesInUse
	// Each image cell's writes go to an upper layer in its own memory,
	// bounded by its share of the cell's writable storage; the unpacked
	// image below is never written. Any cell may be of an image
	// (ProvisionRequest.Image), and runsc needs the same flags for every
	// command on a container, so every command carries it; runsc leaves
	// a read-only root (the default or an operator's) without an overlay.
	p.r.overlay = "root:memory," + sizeOption(diskShares(cfg.CellDiskBytes, true)[diskRoot])

	switch {
	case cfg.Image != "":
		if p.image, err = p.images.pin(cfg.Image); err != nil {
			return nil, err
		}
	case cfg.RootFS == "":
		p.rootfs = filepath.Join(cfg.BundleDir, defaultRootFSDir)
		if p.hostMounts, err = buildDefaultRootFS(p.rootfs, "/"); err != nil {
			return nil, fmt.Errorf("gvisor: default root filesystem: %w", err)
		}
	default:
		if p.rootfs, err = operatorRootFS(cfg.RootFS); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Prepare reports whether the pool's image (Config.Image) is pulled and
// unpacked in the cache (driver.Preparer), and starts pulling it in the
// background when it is not: the reconciler calls it before creating
// cells and never waits for a pull, and no pull ever runs on a claim.
// Until the pull completed it returns an error saying the image is being
// pulled, or the last failure: a failure is retried with a back-off from
// 1 s doubling to 5 min, and a call during the back-off returns the last
// error at once. Without Config.Image it does nothing. Provision waits
// for the pull instead, as it does for a cell's own image.
func (p *Provider) Prepare(context.Context) error {
	if p.image == nil {
		return nil
	}
	if err := p.image.start(); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	return nil
}

// PullImage pulls and unpacks the pool's image (Config.Image) unless it is
// ready, waiting for it (within ctx), with Prepare's back-off, as
// Provision does for a cell of it. Without Config.Image it does nothing.
func (p *Provider) PullImage(ctx context.Context) error {
	if p.image == nil {
		return nil
	}
	if err := p.image.prepare(ctx); err != nil {
		return fmt.Errorf("gvisor: %w", err)
	}
	return nil
}

// imagesInUse lists the image digests of the containers under the state
// root, of any installation. (Cells of other state roots sharing the
// cache are found by their records: imageCache.liveCells.)
func (p *Provider) imagesInUse(ctx context.Context) (map[string]bool, error) {
	cs, err := p.r.list(ctx)
	if err != nil {
		return nil, err
	}
	used := map[string]bool{}
	for _, c := range cs {
		if d := c.Annotations[imageDigestAnnotation]; d != "" {
			used[d] = true
		}
	}
	return used, nil
}

// lookRunsc finds runsc and checks that it runs.
func lookRunsc(path string) (string, error) {
	if path == "" {
		if path = FindRunsc(); path == "" {
			return "", fmt.Errorf("gvisor: runsc not found; build the pinned gVisor with `%s`", InstallCommand)
		}
	}
	found, err := exec.LookPath(path)
	if err != nil {
		return "", fmt.Errorf("gvisor: runsc not found (%v); build the pinned gVisor with `%s`", err, InstallCommand)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, found, "--version")
	cmd.Env = runscEnv
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "runsc version") {
		return "", fmt.Errorf("gvisor: %s --version does not work (%v: %s); build the pinned gVisor with `%s`",
			found, err, truncate(out, 200), InstallCommand)
	}
	return found, nil
}

// privateDir creates dir 0700 if needed and checks that it is a real
// directory owned by this user, then returns its absolute path.
func privateDir(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return "", fmt.Errorf("%s is owned by uid %d, not by this process (uid %d)", dir, st.Uid, os.Getuid())
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", err
	}
	return dir, nil
}

// operatorRootFS checks an operator-provided root filesystem.
func operatorRootFS(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("gvisor: root filesystem %q: %w", dir, err)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", fmt.Errorf("gvisor: root filesystem %q: %w", dir, err)
	}
	if real == "/" {
		return "", fmt.Errorf("gvisor: root filesystem %q is the host's /: refusing to show it to cells", dir)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("gvisor: root filesystem %q: %w", dir, err)
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("gvisor: root filesystem %q is not a directory", dir)
	}
	return real, nil
}

// hostKernelRelease returns the release of the kernel the driver runs on.
func hostKernelRelease() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Capabilities reports kind "gvisor", mode apply, class gvisor_lower_risk,
// identity "gvisor:<hostname>", and Images: a cell may be of any image
// pinned by digest (ProvisionRequest.Image), pulled into the image cache.
func (p *Provider) Capabilities() driver.Capabilities {
	return driver.Capabilities{
		Kind:           "gvisor",
		Mode:           driver.Apply,
		RuntimeClasses: []lease.RuntimeClass{lease.GVisorLowerRisk},
		Identity:       p.identity,
		Images:         true,
		Egress:         p.cfg.Egress != nil,
	}
}

// SetEgress implements driver.EgressEnforcer: the cell's connections are
// held to policy p from now on (a claim's narrower one).
func (p *Provider) SetEgress(ctx context.Context, obj driver.Object, pol egress.Policy) error {
	if p.cfg.Egress == nil {
		return errors.New("gvisor: the provider has no egress net")
	}
	return p.cfg.Egress.Narrow(obj.CellID, pol)
}

// EgressCounts implements driver.EgressEnforcer.
func (p *Provider) EgressCounts(obj driver.Object) map[string]driver.EgressCount {
	if p.cfg.Egress == nil {
		return nil
	}
	return p.cfg.Egress.counts(obj.CellID)
}

// detachEgress removes the egress namespace of container id's cell, if
// the provider has an egress net.
func (p *Provider) detachEgress(ctx context.Context, id string) error {
	if p.cfg.Egress == nil || len(id) < 36 {
		return nil
	}
	cell, err := uuid.Parse(id[len(id)-36:])
	if err != nil {
		return nil
	}
	return p.cfg.Egress.Detach(ctx, cell)
}

// containerPrefix starts the container ID of every cell of this
// installation.
func (p *Provider) containerPrefix() string { return "sbw-" + p.cfg.Installation + "-" }

// containerID is the runsc container ID a new cell gets:
// "sbw-<installation>-<cell>", 53 characters whatever the pool, so that
// runsc's control socket (<StateDir>/runsc-<id>.sock, at most 107 bytes)
// fits under any StateDir of up to 42 characters; runsc falls back to
// /var/run, /run and /tmp for longer ones.
func (p *Provider) containerID(cell uuid.UUID) string {
	return p.containerPrefix() + cell.String()
}

// objectID is the container ID of an existing object: the one its
// recorded identity ("<container-id>@<nonce>") names, so that a cell keeps
// being found under the name it was provisioned with (cells provisioned
// before installation tags are "sbw-<pool>-<cell>"). Only an object
// without an identity (a provision that failed before recording it) gets
// the name a new cell would. It returns false for an identity no
// container of the cell can have: that object does not exist.
func (p *Provider) objectID(obj driver.Object) (string, bool) {
	if obj.Identity == "" {
		return p.containerID(obj.CellID), true
	}
	id, _, ok := strings.Cut(obj.Identity, "@")
	if !ok || !strings.HasPrefix(id, "sbw-") || !strings.HasSuffix(id, "-"+obj.CellID.String()) || !containerIDRE.MatchString(id) {
		return "", false
	}
	return id, true
}

var containerIDRE = regexp.MustCompile(`^[A-Za-z0-9_.-]+$`)

// cellOf maps a container of this installation and pool back to its cell
// ID.
func (p *Provider) cellOf(st *containerState) (uuid.UUID, bool) {
	rest, ok := strings.CutPrefix(st.ID, p.containerPrefix())
	if !ok || len(rest) != 36 || st.Annotations[poolAnnotation] != p.cfg.Pool {
		return uuid.UUID{}, false
	}
	cell, err := uuid.Parse(rest)
	if err != nil || cell.String() != rest {
		return uuid.UUID{}, false
	}
	return cell, true
}

func (p *Provider) bundlePath(id string) string { return filepath.Join(p.cfg.BundleDir, id) }

// identityOf is the identity of a container runsc reports: its ID and the
// nonce written into its spec when it was provisioned. A container
// recreated under the same ID has another nonce.
func identityOf(st *containerState) string {
	return st.ID + "@" + st.Annotations[nonceAnnotation]
}

// How long cleanup after a failed provisioning may take, whatever the
// caller's context says.
const cleanupTimeout = time.Minute

// Provision creates and starts the cell's container and waits until runsc
// reports it running. It is idempotent: a running container of the cell is
// returned as it is. A container of the cell in any other state (left by a
// crash) is destroyed and created again. A failed or cancelled provisioning
// destroys what it created before returning.
//
// The cell's root is req.Image when set — a reference pinned by digest
// (anything else is refused before anything is made), pulled into the
// image cache within ctx unless it is there (concurrent provisions of one
// image pull it once), under the cache's budget — else Config.Image, else
// the default or operator's root filesystem. The image is held (no
// eviction takes it) from its pull until the container runs.
func (p *Provider) Provision(ctx context.Context, req driver.ProvisionRequest) (driver.Object, error) {
	if req.RuntimeClass != "" && req.RuntimeClass != lease.GVisorLowerRisk {
		return driver.Object{}, fmt.Errorf("gvisor: runtime class %q is not served (only %s)", req.RuntimeClass, lease.GVisorLowerRisk)
	}
	id := p.containerID(req.CellID)
	img := p.image
	if req.Image != "" {
		var err error
		if img, err = p.images.store(req.Image); err != nil {
			return driver.Object{}, fmt.Errorf("gvisor: provision %s: %w", id, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return driver.Object{}, fmt.Errorf("gvisor: provision: %w", err)
	}
	if img != nil {
		release, err := img.acquire(ctx)
		if err != nil {
			return driver.Object{}, fmt.Errorf("gvisor: provision %s: %w", id, err)
		}
		defer release()
	}
	unlock, err := p.locks.lock(ctx, id)
	if err != nil {
		return driver.Object{}, fmt.Errorf("gvisor: provision %s: %w", id, err)
	}
	defer unlock()

	var lastErr error
	for attempt := 0; attempt < 2; attempt++ {
		var st *containerState
		var err error
		if !p.r.noStateFile(id) {
			st, err = p.state(ctx, id)
		}
		if err != nil {
			return driver.Object{}, fmt.Errorf("gvisor: provision %s: %w", id, err)
		}
		if st != nil {
			if st.Status == statusRunning && st.Annotations[nonceAnnotation] != "" {
				return driver.Object{CellID: req.CellID, Identity: identityOf(st)}, nil
			}
			p.log.Warn("container left in a broken state; destroying it before provisioning again",
				"container", id, "status", st.Status)
			if err := p.destroyContainer(ctx, id); err != nil {
				return driver.Object{}, fmt.Errorf("gvisor: provision %s: clearing broken container: %w", id, err)
			}
		}
		obj, err := p.create(ctx, req.CellID, id, img, req.Egress)
		if err == nil {
			p.log.Info("cell provisioned", "container", id, "identity", obj.Identity)
			return obj, nil
		}
		lastErr = err
		// Leave nothing behind, even when ctx is done.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		cerr := p.destroyContainer(cctx, id)
		cancel()
		if cerr != nil {
			return driver.Object{}, fmt.Errorf("gvisor: provision %s: %w (and cleaning up: %w)", id, err, cerr)
		}
		if ctx.Err() != nil {
			return driver.Object{}, fmt.Errorf("gvisor: provision %s: %w", id, err)
		}
		if cgroupFailure(err) && !p.r.ignoreCgroups.Load() {
			p.r.ignoreCgroups.Store(true)
			p.log.Warn("runsc cannot apply cgroup limits on this host; running cells with --ignore-cgroups "+
				"(no memory or CPU limit is enforced on the host)", "error", err)
			attempt-- // the fallback does not use up the retry
		}
	}
	return driver.Object{}, fmt.Errorf("gvisor: provision %s: %w", id, lastErr)
}

// create writes a fresh bundle and the cell's host directory, creates and
// starts the container (its root img's when img is not nil) and waits
// until its agent answers, checking the kernel from inside meanwhile.
func (p *Provider) create(ctx context.Context, cell uuid.UUID, id string, img *imageStore, pol egress.Policy) (driver.Object, error) {
	nonce, err := randomHex(16)
	if err != nil {
		return driver.Object{}, err
	}
	bundle, hostDir := p.bundlePath(id), p.hostDir(id)
	if err := p.removeBundle(id); err != nil {
		return driver.Object{}, err
	}
	if err := os.Mkdir(bundle, 0o700); err != nil {
		return driver.Object{}, err
	}
	if err := os.Mkdir(hostDir, 0o700); err != nil {
		return driver.Object{}, err
	}
	if err := mountHostDir(hostDir, p.cfg.RecordAgentMessages); err != nil {
		return driver.Object{}, err
	}
	spec := p.spec(cell.String(), nonce, hostDir, img)
	if p.cfg.Egress != nil {
		if err := p.egressSpec(ctx, &spec, cell, bundle, img, pol); err != nil {
			return driver.Object{}, err
		}
	}
	if err := writeJSON(filepath.Join(bundle, "config.json"), spec); err != nil {
		return driver.Object{}, err
	}
	if img != nil {
		// Recorded before the container exists, removed once its deletion
		// is proven: no installation evicts the image under the cell.
		if err := p.images.record(id, img.digest); err != nil {
			return driver.Object{}, fmt.Errorf("recording the cell's image: %w", err)
		}
	}
	// One runsc start, not two: `run --detach` is `create` and `start` in
	// one process, and destroys what it created when the start fails.
	if _, err := p.r.run(ctx, "run", "--detach", "--bundle", bundle, id); err != nil {
		return driver.Object{}, err
	}
	st, err := p.state(ctx, id)
	switch {
	case err != nil:
		return driver.Object{}, err
	case st == nil:
		return driver.Object{}, errors.New("container vanished after start")
	case st.Status != statusRunning:
		return driver.Object{}, fmt.Errorf("container is %s after start", st.Status)
	case st.Annotations[nonceAnnotation] != nonce:
		return driver.Object{}, errors.New("runsc reports another container under the same ID")
	}
	// The admission's kernel check from inside (Inspect's, remembered for
	// this identity) reads the kernel release the agent reports: nothing
	// but the agent has run in the cell yet, and its uname is answered by
	// the sandbox's kernel as any process's is. The connection the agent
	// answered on is the one the cell's first lease operation uses.
	identity := identityOf(st)
	status, err := p.awaitAgent(ctx, id, p.client(identity, id))
	if err != nil {
		p.forget(id)
		p.dropAgents(id)
		return driver.Object{}, err
	}
	if status.Kernel != "" {
		p.judgeKernel(id, st, status.Kernel, new(driver.Observation))
	}
	return driver.Object{CellID: cell, Identity: identity}, nil
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// Inspect asks runsc for the cell's container and, when it runs, checks
// from inside that it runs under gVisor: the kernel release the cell sees
// must differ from the host's, and the container's sandbox process must be
// runsc's. RuntimeClass is gvisor_lower_risk only when both hold.
//
// The check from inside costs an exec, so it runs once per object, and
// Provision makes it with the release the cell's agent reports when it
// first answers (before anything else ran in the cell): an identity that
// passed it is remembered, and later inspections of the same identity read
// runsc's state file and check that the container's sandbox process is
// still runsc's. A container cannot change runtime without changing
// identity (a new container gets a new nonce).
func (p *Provider) Inspect(ctx context.Context, obj driver.Object) (o driver.Observation, err error) {
	id, ok := p.objectID(obj)
	if !ok {
		return driver.Observation{Detail: fmt.Sprintf("identity %q names no container of cell %s", obj.Identity, obj.CellID)}, nil
	}
	if st := p.r.stateFile(id); st != nil && st.Status == statusRunning {
		identity := identityOf(st)
		if _, ok := p.verified.Load(identity); ok && p.isSandboxProcess(st.Pid, id) {
			image, why := p.mountedImage(st)
			return driver.Observation{Exists: true, Identity: identity, RuntimeClass: lease.GVisorLowerRisk, Ready: true,
				AgentDigest: st.Annotations[agentDigestAnnotation], ImageDigest: image,
				Detail: fmt.Sprintf("runsc's state shows container %s running in sandbox pid %d; its gVisor kernel was verified from inside earlier", id, st.Pid) +
					imageDetail(why)}, nil
		}
	}
	st, err := p.state(ctx, id)
	if err != nil {
		return driver.Observation{}, fmt.Errorf("gvisor: inspect %s: %w", id, err)
	}
	if st == nil {
		return driver.Observation{Detail: "runsc reports no container " + id}, nil
	}
	image, imgWhy := p.mountedImage(st)
	o = driver.Observation{Exists: true, Identity: identityOf(st), AgentDigest: st.Annotations[agentDigestAnnotation], ImageDigest: image}
	defer func() {
		if err == nil {
			o.Detail += imageDetail(imgWhy)
		}
	}()
	if st.Status != statusRunning {
		o.Detail = fmt.Sprintf("runsc reports container %s %s", id, st.Status)
		return o, nil
	}
	if err := p.checkKernel(ctx, id, st, &o); err != nil {
		return driver.Observation{}, fmt.Errorf("gvisor: inspect %s: %w", id, err)
	}
	return o, nil
}

// checkKernel checks from inside running container id, whose state is st,
// that it runs under gVisor: `uname -r` in it must name a kernel other than
// the host's, and st's sandbox process must be runsc's. It records in o
// what it found: Ready once the command ran, RuntimeClass
// gvisor_lower_risk when both hold (and then st's identity is remembered
// as verified), and the Detail. The error is ctx's, when it ended.
func (p *Provider) checkKernel(ctx context.Context, id string, st *containerState, o *driver.Observation) error {
	release, code, err := p.runInside(ctx, id, "uname", "-r")
	switch {
	case err != nil && ctx.Err() != nil:
		return err
	case err != nil:
		o.Detail = fmt.Sprintf("runsc reports container %s running, but exec in it failed: %v", id, err)
		return nil
	case code != 0:
		o.Detail = fmt.Sprintf("runsc reports container %s running, but `uname -r` in it exited %d", id, code)
		return nil
	}
	p.judgeKernel(id, st, string(release), o)
	return nil
}

// judgeKernel records in o what the kernel release a process in running
// container id (state st) saw tells: Ready, RuntimeClass
// gvisor_lower_risk when it is not the host's and st's sandbox process is
// runsc's (and then st's identity is remembered as verified), and the
// Detail.
func (p *Provider) judgeKernel(id string, st *containerState, release string, o *driver.Observation) {
	sandbox := p.isSandboxProcess(st.Pid, id)
	o.Ready = true
	ok, why := sandboxedKernel(p.hostKernel, release)
	switch {
	case !sandbox:
		o.Detail = fmt.Sprintf("runsc reports container %s running, but its pid %d is not a runsc sandbox process; %s", id, st.Pid, why)
	case !ok:
		o.Detail = fmt.Sprintf("runsc reports container %s running in sandbox pid %d, but %s", id, st.Pid, why)
	default:
		o.RuntimeClass = lease.GVisorLowerRisk
		o.Detail = fmt.Sprintf("runsc reports container %s running in sandbox pid %d; %s", id, st.Pid, why)
		p.verified.Store(identityOf(st), struct{}{})
	}
}

// forget drops the verified identities of a container, and its gofer.
func (p *Provider) forget(id string) {
	for _, m := range []*sync.Map{&p.verified, &p.gofers} {
		m.Range(func(k, _ any) bool {
			if strings.HasPrefix(k.(string), id+"@") {
				m.Delete(k)
			}
			return true
		})
	}
}

// sandboxedKernel compares the kernel release the host runs with the one a
// cell sees. A cell under gVisor sees gVisor's own (4.19.0-gvisor in the
// pinned runsc, 4.4.0 in Debian's), never the host's.
func sandboxedKernel(host, guest string) (bool, string) {
	host, guest = strings.TrimSpace(host), strings.TrimSpace(guest)
	switch {
	case guest == "":
		return false, "the cell reports no kernel release"
	case host == "":
		return false, "the host's kernel release is unknown"
	case guest == host:
		return false, fmt.Sprintf("the cell sees the host's kernel %q", host)
	}
	return true, fmt.Sprintf("the cell sees kernel %q, the host runs %q", guest, host)
}

// state returns the container's state from runsc's own state file, which
// answers in microseconds, and asks `runsc state` (a process start of tens
// of milliseconds) only when the file is missing or unreadable, or names a
// sandbox process that is gone: runsc stays the authority on absence and
// on a sandbox that died.
func (p *Provider) state(ctx context.Context, id string) (*containerState, error) {
	if st := p.r.stateFile(id); st != nil && (st.Status != statusRunning || p.isSandboxProcess(st.Pid, id)) {
		return st, nil
	}
	return p.r.state(ctx, id)
}

// isSandboxProcess reports whether host pid pid is runsc's sandbox of
// container id under this provider's state root.
func (p *Provider) isSandboxProcess(pid int, id string) bool {
	if pid <= 0 {
		return false
	}
	raw, err := os.ReadFile(filepath.Join(p.procRoot, fmt.Sprint(pid), "cmdline"))
	if err != nil {
		return false
	}
	argv := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
	return filepath.Base(argv[0]) == "runsc-sandbox" && slices.Contains(argv, "boot") &&
		belongs(argv, p.r.root, id, p.bundlePath(id))
}

// Destroy kills and deletes the cell's container and returns nil only with
// proof that it is gone: `runsc state` says it does not exist and no host
// process of its sandbox remains. When runsc reports a container of another
// identity under the cell's name, obj is gone already and that container
// is left alone. An object with an empty identity names whatever container
// the cell has.
func (p *Provider) Destroy(ctx context.Context, obj driver.Object) error {
	id, ok := p.objectID(obj)
	if !ok {
		p.log.Info("destroy: the identity names no container of the cell; the object does not exist",
			"cell_id", obj.CellID, "identity", obj.Identity)
		return nil
	}
	p.forget(id)
	p.dropAgents(id)
	unlock, err := p.locks.lock(ctx, id)
	if err != nil {
		return fmt.Errorf("gvisor: destroy %s: %w: %w", id, driver.ErrUncertain, err)
	}
	defer unlock()
	st, err := p.state(ctx, id)
	if err != nil {
		return fmt.Errorf("gvisor: destroy %s: %w: %w", id, driver.ErrUncertain, err)
	}
	if st != nil && obj.Identity != "" && identityOf(st) != obj.Identity {
		p.log.Info("destroy: the cell's name belongs to another container; the object is gone",
			"container", id, "identity", obj.Identity, "found", identityOf(st))
		return nil
	}
	if err := p.destroyContainer(ctx, id); err != nil {
		return err
	}
	if st != nil {
		p.log.Info("cell destroyed", "container", id)
	}
	return nil
}

// Time allowed for a deleted container's host processes to exit, before
// they are killed and again after.
const processGrace = 3 * time.Second

// destroyContainer removes container id whatever its state, and proves it.
// Errors wrap driver.ErrUncertain.
func (p *Provider) destroyContainer(ctx context.Context, id string) error {
	uncertain := func(format string, args ...any) error {
		return fmt.Errorf("gvisor: destroy %s: %w: %s", id, driver.ErrUncertain, fmt.Sprintf(format, args...))
	}
	bundle := p.bundlePath(id)
	// No `runsc kill` first: `delete --force` of a cell's container (its
	// sandbox's root container, whatever its state) SIGKILLs the sandbox
	// and the gofer and waits for them before it removes the state, and
	// what follows proves it either way.
	if _, err := p.r.run(ctx, "delete", "--force", id); err != nil && !notExist(err) {
		return uncertain("%v", err)
	}
	st, err := p.r.state(ctx, id)
	if err != nil {
		return uncertain("%v", err)
	}
	if st != nil {
		return uncertain("runsc state still reports the container %s after delete", st.Status)
	}
	if err := p.awaitNoProcesses(ctx, id, bundle); err != nil {
		return uncertain("%v", err)
	}
	if err := p.removeBundle(id); err != nil {
		return uncertain("removing the bundle: %v", err)
	}
	if err := p.detachEgress(ctx, id); err != nil {
		return uncertain("removing the egress namespace: %v", err)
	}
	if err := p.images.unrecord(id); err != nil {
		return uncertain("removing the cell's image record: %v", err)
	}
	return nil
}

// awaitNoProcesses waits until no host process of the container remains.
// Stragglers (a sandbox whose runsc run was killed before it wrote the
// state file, a runsc command stuck on a dead sandbox) are killed after a
// grace period.
func (p *Provider) awaitNoProcesses(ctx context.Context, id, bundle string) error {
	deadline := time.Now().Add(processGrace)
	killed := false
	for {
		procs, err := containerProcesses(p.procRoot, p.r.root, id, bundle)
		if err != nil {
			return fmt.Errorf("scanning host processes: %w", err)
		}
		if len(procs) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			if killed {
				return fmt.Errorf("host processes of the container remain: %s", describe(procs))
			}
			p.log.Warn("killing host processes left by a deleted container", "container", id, "processes", describe(procs))
			for _, proc := range procs {
				_ = syscall.Kill(proc.pid, syscall.SIGKILL)
			}
			killed = true
			deadline = time.Now().Add(processGrace)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("host processes of the container remain (%s): %w", describe(procs), ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func describe(procs []hostProcess) string {
	s := make([]string, len(procs))
	for i, pr := range procs {
		s[i] = fmt.Sprintf("pid %d (%s)", pr.pid, filepath.Base(pr.argv[0]))
	}
	return strings.Join(s, ", ")
}

// List returns every container of this installation and pool under the
// state root, in any state, so the reconciler can destroy orphans left by
// a crash. Containers of other installations sharing the state root, and
// cells provisioned before installation tags, are never listed.
func (p *Provider) List(ctx context.Context) ([]driver.Object, error) {
	cs, err := p.r.list(ctx)
	if err != nil {
		return nil, fmt.Errorf("gvisor: list: %w", err)
	}
	var objs []driver.Object
	for i := range cs {
		if cell, ok := p.cellOf(&cs[i]); ok {
			objs = append(objs, driver.Object{CellID: cell, Identity: identityOf(&cs[i])})
		}
	}
	slices.SortFunc(objs, func(a, b driver.Object) int { return strings.Compare(a.CellID.String(), b.CellID.String()) })
	return objs, nil
}

// keyedMutex serializes Provision and Destroy per container within one
// Provider. runsc's own file locks serialize single commands across
// processes.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	ch   chan struct{} // holds one token while locked
	refs int
}

// lock locks key, or returns ctx's error.
func (k *keyedMutex) lock(ctx context.Context, key string) (func(), error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = make(map[string]*keyedEntry)
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{ch: make(chan struct{}, 1)}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case e.ch <- struct{}{}:
		return func() { <-e.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}
