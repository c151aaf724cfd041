// Package gvisor is the local driver: each sterile cell is an OCI container
// run by gVisor's runsc on this host, serving the runtime class
// gvisor_lower_risk (a shared host kernel behind gVisor's user-space
// kernel). Every cell runs the static cell agent (cmd/sandboxwich-agent)
// as its init, and the Provider is a driver.AgentHost: tenant commands,
// files and the launch go through the agent, never through runsc exec.
//
// # Requirements
//
// Linux, root, and runsc at the pinned RunscVersion: scripts/install-runsc.sh
// or InstallCommand build it from gVisor's Go module into the cache
// FindRunsc looks in first (InstallRunsc does the same from Go). The agent
// binary is Config.AgentPath, else a sandboxwich-agent next to the running
// executable, else one built with the Go toolchain; it must be a static
// executable. Cell images (Config.Image, or a cell's own) are pulled over
// the OCI distribution API, by digest only.
//
// # Settings
//
// A pool of provider "gvisor" takes the settings runsc, agent_path,
// state_dir, bundle_dir, rootfs, network, platform, memory_limit_bytes,
// cpus, pids_limit, image (the pool's key image), image_cache_dir,
// image_cache_bytes, registry_auth_file, image_max_bytes and
// cell_disk_bytes (the pool's key cell_disk_bytes)
// (SANDBOXWICH_GVISOR_<KEY> for the environment's pool), the Config fields
// of the same names.
//
// # Cell images
//
// A cell's root is an image pinned by digest when Provision is asked for
// one (driver.ProvisionRequest.Image; Capabilities reports Images, as an
// image class needs, CONTRACT §21), else Config.Image, else the default or
// operator's root filesystem. Every image is pulled, verified and unpacked
// once per digest into the content-addressed cache Config.ImageCacheDir,
// shared read-only by every cell, pool and installation that uses it, each
// cell writing to a private layer in its own memory. A cell's own image is
// pulled by Provision within its context, unless cached; concurrent
// provisions of one image, in any process, pull it once; a reference that
// is not pinned by digest is refused before anything is made, and no tag
// is ever resolved. Inspect reports the digest really mounted. The
// provider is a driver.ImageCache: Prefetch pulls an image without a
// cell; CachedImages and CacheStats describe the cache, and CacheID names
// it (its directory) so that the plane counts a shared cache once.
//
// The cache's budget, Config.ImageCacheBytes (0: unbounded), bounds its
// unpacked images together, as they take on disk. Before a pull (the
// image's compressed size reserved) and after it (its measured size), the
// least recently used images are evicted until the cache fits — an image's
// use is its last provision or prefetch on demand, or, for a pool's
// Config.Image, its unpacking — but never an image in use: one a live cell
// of any installation sharing the cache mounts (each image cell is
// recorded in the cache from before its container exists until its
// deletion is proven, and a provision holds its image from the pull until
// the container runs), one a pool names as Config.Image, or one being
// pulled. A pull that cannot fit fails with an *ImageCacheFullError
// (matching driver.ErrImageCacheFull) and leaves nothing behind. Apart from the budget, a pool image no pool
// references any more is removed after its pool's next pull; images used
// on demand are left to the budget.
//
// # Guarantees
//
//   - Isolation: a cell has no network (--network=none) — or, with
//     Config.Egress (an EgressNet: CONTRACT §22), a network namespace of
//     its own whose only route leads to the egress gateway, which answers
//     DNS for the names its policy allows and proxies TLS (by SNI) and
//     HTTP (by Host) to them alone (root in a cell cannot add a route) —
//     sees its own
//     kernel (Provision checks from inside, with the release the cell agent
//     reports when it first answers, that the kernel release differs
//     from the host's before anything else runs there), and gets nothing of
//     the driver's environment; command lines carry only paths, IDs and PIDs.
//   - Limits: Config.MemoryLimitBytes (default 512 MiB), Config.CPUs
//     (default 1) and Config.PidsLimit (default 1024, which bounds a fork
//     bomb: the sandbox is lost, not the host) are enforced through cgroups;
//     where runsc cannot use cgroups the driver falls back to
//     --ignore-cgroups, logs a warning, and only the disk sizes still hold.
//   - Disk: a cell's writable places live in its memory and together hold
//     Config.CellDiskBytes (default half the memory); a full one is ENOSPC
//     in the cell and the cell lives.
//   - Images: the manifest, configuration and every layer are verified
//     against the pinned digest, and Inspect reports the digest admitted;
//     the image cache stays within its budget, and an image a live cell
//     uses is never removed.
//   - Ownership: container IDs carry the installation tag and List returns
//     only this installation's and pool's containers, so planes sharing a
//     host never destroy each other's cells.
//   - Deletion: Destroy proves absence (runsc reports the container gone and
//     no host process names it); anything less wraps driver.ErrUncertain.
//
// docs/gvisor.md describes the image cache and pull, the agent's lookup and
// channel, runsc's flags, the limits and disk shares in detail, what a cell
// can see, and each step of a cell's life.
package gvisor
