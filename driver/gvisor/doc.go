// Package gvisor is the local driver: each sterile cell is an OCI container
// run by gVisor's runsc on this host, serving the runtime class
// gvisor_lower_risk (a shared host kernel behind gVisor's user-space
// kernel).
//
// Install runsc with scripts/install-runsc.sh, or run InstallCommand: both
// build gVisor's runsc from its Go module at the pinned RunscVersion (about
// a minute on 2 cores) into the cache FindRunsc looks in first. Such a
// build prints VERSION_MISSING for `runsc --version`; `go version -m`
// identifies it. Debian's `runsc` package (gVisor 20221219) is only a
// fallback: its statx rejects the AT_NO_AUTOMOUNT flag of GNU coreutils 9,
// so `ls` and `stat` fail with "Invalid argument" in cells on a Debian
// bookworm /usr (TestLsAndStat catches such a runsc), and it predates the
// --host-uds flag the cell agent's channel needs, so it cannot create
// cells at all any more.
//
// # Settings
//
// A pool of provider "gvisor" takes the settings runsc, agent_path,
// state_dir, bundle_dir, rootfs, network, platform, memory_limit_bytes,
// cpus, pids_limit, image (the pool's key image), image_cache_dir,
// registry_auth_file, image_max_bytes and cell_disk_bytes (the pool's key
// cell_disk_bytes) (SANDBOXWICH_GVISOR_<KEY> for the environment's pool),
// the Config fields of the same names.
//
// # Cell images
//
// With Config.Image, an OCI reference pinned by digest
// ("host/repo@sha256:<hex>", optionally with a tag that is never
// resolved), every cell's root is that image (CONTRACT §15):
//
//   - Pull: Prepare (driver.Preparer; the reconciler calls it before it
//     creates cells, never on a claim's path) starts the pull in the
//     background and reports "being pulled" until it completed, so a pass
//     never waits for it; PullImage, which Provision calls, waits. The
//     pull fetches the image with go-containerregistry over the OCI
//     distribution API, by digest only. The manifest is checked against
//     the reference's digest (for an index, the linux manifest of this
//     architecture against the index's entry, and the index against the
//     reference), the configuration and every layer blob against their
//     digests in the manifest; a blob of another digest is refused and
//     nothing of it kept. Layers must be tar (plain, gzip or zstd). A
//     failed pull is retried with a back-off from 1 s doubling to 5 min,
//     and the pool shows it in /v1/pools last_error and
//     sandboxwich_pool_unprepared. Credentials come from
//     Config.RegistryAuthFile, a Docker config.json (its auths entries;
//     credential helpers are not run), read at each pull; they never
//     reach a cell. Without it the pull is anonymous.
//   - Cache: Config.ImageCacheDir (default
//     os.UserCacheDir()/sandboxwich/images, or image-cache under
//     BundleDir; made 0700, as unpacked images keep their owners and
//     modes, set-id programs included) holds each image once, unpacked in
//     sha256-<hex>/rootfs,
//     with the digest in sha256-<hex>/digest and the manifest beside it.
//     A pull holds the flock sha256-<hex>.lock, unpacks into
//     .tmp-sha256-<hex> and renames it into place only when complete (the
//     digest file written last): providers of any process produce one
//     copy, and a crash leaves only the temporary directory, which the
//     next pull removes. Verified blobs are kept in .blobs-sha256-<hex>
//     until the unpack completes, so a pull interrupted by a restart
//     fetches only what it lacked. Unpacking applies OCI whiteouts
//     (".wh.<name>", ".wh..wh..opq"), refuses an entry that climbs out of
//     the root ("..", a parent that is a symlink, a hard link outside),
//     skips device nodes and FIFOs, and adds the cells' mount points the
//     image lacks (/proc, /dev, /sys, /tmp, /var/tmp, /home/cell,
//     /run/sandboxwich, /.sandboxwich/agent), so runsc never writes into
//     the shared copy.
//   - Cells: the root is the shared copy, and runsc runs with
//     --overlay2=root:memory,size=<its share of Config.CellDiskBytes>:
//     each cell writes to a private upper layer in its own memory
//     (counted against its memory limit, bounded as "Disk" says), which
//     vanishes with it; a second cell of the same image, in any pool, adds no copy
//     of the lower layer. The agent is bind-mounted into the image as
//     everywhere and runs as PID 1; it needs no C library. Inspect's
//     kernel check needs uname in the image (a static busybox serves).
//   - Admitted digest: the image's digest is annotated in the spec
//     (dev.sandboxwich.image-digest), and Inspect reports
//     Observation.ImageDigest from what runsc really mounted: the mount
//     table of the container's gofer (/proc/<pid>/mountinfo of the
//     runsc-gofer process, which serves the root to the sandbox) must
//     show its root as a read-only mount of <cache>/sha256-<hex>/rootfs,
//     that digest must be the annotated one, and the cache directory must
//     record it as completely unpacked. Anything else reports no digest
//     (and says why in the detail); the plane compares it with the pool's
//     pinned digest.
//   - Collection: each installation and pool records the digest it uses
//     in refs/<installation>-<pool>, before it pulls. After a successful
//     pull, an image no refs file names and no container under the state
//     root mounts is removed, under its lock and after reading the refs
//     again, renamed away first, with what crashed pulls left of it. A pool removed from every configuration
//     keeps its refs file: delete it to release the image.
//
// # The cell agent
//
// Every cell runs the cell agent (package agent, CONTRACT §13) as its init
// (PID 1), and the Provider is a driver.AgentHost: tenant commands, files
// and the launch go through the agent, never through runsc exec.
//
// The binary is a static sandboxwich-agent (cmd/sandboxwich-agent, built
// with CGO_ENABLED=0, so it runs on any root filesystem, one without a C
// library included). New takes the first of:
//
//  1. Config.AgentPath (setting agent_path);
//  2. a sandboxwich-agent next to the running executable (os.Executable),
//     as `go install` and release archives place it;
//  3. one built with the Go toolchain in PATH: for a development build of
//     the module (`go run ./cmd/sandboxwich dev` in a checkout, tests), from
//     the module's source, found with `go list -m -f {{.Dir}}
//     github.com/sandboxwich/sandboxwich` from the working directory, by
//     `CGO_ENABLED=0 go build -trimpath -ldflags='-s -w'
//     ./cmd/sandboxwich-agent`; for a released build, `go install
//     -trimpath -ldflags='-s -w'
//     github.com/sandboxwich/sandboxwich/cmd/sandboxwich-agent@<version>`
//     of the version recorded in the running binary (debug.ReadBuildInfo),
//     with GOBIN a temporary directory.
//
// When none works, New fails with an error naming agent_path and the build
// command. The binary found is checked (a static ELF executable of this
// architecture) and copied into a content-addressed cache,
// os.UserCacheDir()/sandboxwich/agent/sha256-<hex>/sandboxwich-agent (or,
// without a user cache directory, under the bundle directory; a
// read-only file), and that copy is what every cell mounts, so replacing
// the original never changes a running cell's agent. Its digest,
// "sha256:<hex>" of the mounted file, is computed once in New, written into
// each container's spec (annotation dev.sandboxwich.agent-digest), and
// Inspect reports Observation.AgentDigest from runsc's state of the
// container (its annotations), never from the Provider's memory: a cell
// created by another Provider, or before an upgrade, reports its own.
//
// Channel: each cell has a host directory, <BundleDir>/<container-id>/run,
// a tmpfs of its own (mode 0700, 64 KiB, 16 inodes; 1 GiB with
// RecordAgentMessages) mounted on the host before the container is created
// and unmounted and removed with the bundle at Destroy. It is bind-mounted
// read-write (nosuid, nodev, noexec) at /run/sandboxwich in the cell, and
// the agent listens on /run/sandboxwich/agent.sock there: runsc's
// --host-uds=create lets the sandbox create that socket on the host, where
// the Provider dials it (through /proc/self/fd/<dir>, so no bundle path
// meets the 107-byte limit of a socket address). Only root on the host and
// root in the cell can reach it; a cell-user workload cannot enter the
// directory. The cell keeps --network=none, and --host-uds is never
// "open" or "all", so nothing in a cell can connect to a host socket. Any
// Provider over the same directories reaches the agent of any cell: a
// restarted server or another replica finds it. Being a tmpfs, the
// directory bounds what a root workload can write through it to the host.
//
// Provision waits until the started cell's agent answers its status.
// Agent returns an agent.Conn for a cell (one HTTP client per container,
// dropped at Destroy): driver.ErrNotFound for an unknown object,
// driver.ErrCellLost for a container that stopped, and a call that fails
// without an answer while runsc then shows the container stopped (or its
// sandbox no longer answering) wraps driver.ErrCellLost: the agent is the
// cell's init, so its exit, killed by a root workload or crashed, ends the
// sandbox.
//
// The agent runs as root (uid 0) with no_new_privs and exactly CAP_CHOWN,
// CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_KILL, CAP_SETGID and CAP_SETUID in its
// bounding, effective and permitted sets (none inheritable or ambient):
// SETUID/SETGID to start workloads and file helpers as the cell user, KILL
// to kill the cell user's processes at a timeout, at expiry and at
// release, CHOWN to give the cell user what it writes, DAC_OVERRIDE and
// FOWNER to act as root on files of any owner and mode. Root workloads
// inherit that set; cell-user workloads (uid 1000) hold no capability and
// can neither signal nor trace the agent nor read its /proc entries. Left
// out: CAP_FSETID (set-id bits grant nothing under no_new_privs),
// CAP_SETPCAP (a switch to uid 1000 drops every capability, and none can
// be regained), CAP_SYS_PTRACE, CAP_SYS_ADMIN, CAP_NET_*, CAP_MKNOD and the
// rest. A root workload can kill the agent (gVisor delivers SIGKILL to a
// PID 1 from inside): that ends the cell, which then reports cell_lost.
// As PID 1 the agent points its stdio at /dev/null, so no cell process can
// reach the host files runsc create hands a container's init.
//
// Config.RecordAgentMessages is for tests only: the agent then runs with
// -record and appends every request it receives (bodies included) to
// agent-messages in the cell's host directory, which
// Provider.AgentMessages reads until the cell is destroyed, so plane-level
// tests can prove that no secret ever reached a cell.
//
// # runsc invocation
//
// Every runsc command the driver runs (one helper builds them all) carries
// the same global flags:
//
//	--root=<StateDir>   a state root (0700) of this user: by default one
//	                    shared by every plane of the user on the host;
//	                    the installation tag in the container IDs keeps
//	                    them apart
//	--network=none      the default; runsc needs the same value on create,
//	                    start and exec, or start fails
//	--host-uds=create   lets the sandbox create Unix sockets on the host,
//	                    which only the cell's host directory allows: the
//	                    agent's socket (never open or all)
//	--platform=<P>      only when Config.Platform is set; runsc's default
//	                    (systrap in the pinned runsc, ptrace in Debian's)
//	                    needs no /dev/kvm and works in containers and VMs
//	                    alike (kvm hung at create on the nested-
//	                    virtualisation machine this was built on), so the
//	                    driver leaves it to runsc
//	--ignore-cgroups    only after runsc failed to create a container
//	                    because of cgroups (detected once per Provider)
//
// runsc runs as root, with an environment of PATH alone: nothing of the
// driver's environment reaches it or a cell. Command lines carry only
// paths, container IDs and PIDs. The only runsc exec is the Provider's own
// read-back from inside (Inspect's kernel check), its process spec in a
// 0600 file (runsc exec --process).
//
// # Limits
//
// Each cell's spec asks for Config.MemoryLimitBytes (default 512 MiB) and
// Config.CPUs (default 1, as a CFS quota over a 100 ms period). runsc puts
// the sandbox into cgroups /<container-id> of each controller and sizes the
// guest's memory to the limit (the cell's /proc/meminfo shows it). Where
// runsc cannot use cgroups, the driver falls back to --ignore-cgroups and
// logs a warning: no memory, CPU or process limit is then enforced on the
// host, and the guest sees the host's memory size. A host without a pids
// controller makes runsc refuse the spec's process limit with a cgroup
// error, which takes that same fallback.
//
// Processes: the spec's linux.resources.pids.limit is Config.PidsLimit
// (default 1024, at least MinPidsLimit), which runsc writes to pids.max of
// the sandbox's host cgroup. That cgroup counts the sandbox's host tasks,
// not guest processes: an idle cell holds about 25 (sentry threads,
// gofer), and each guest process costs about two more under systrap (300
// sleeping guest processes: 633 host tasks), so the default admits roughly
// 500 guest processes. This is what stops a fork bomb: under
// TestForkBombIsBounded the cell's cgroup peaked at exactly 1024 tasks
// (without the limit it passed 1282 in under two seconds and, in the
// original incident, reached about 5,200 host tasks). Reaching the limit
// ends the sandbox, not just the fork: the sentry cannot create the host
// threads it needs and dies. The agent call then fails with ErrSandboxLost
// (the cell is lost: quarantine it and destroy it; Destroy proves it
// gone), and the host is unharmed. gVisor's own sentry-side pids controller would
// fail guest forks with EAGAIN instead, but runsc does not seed it from
// the spec (it seeds only the CPU and memory controllers), it charges tasks
// only when cgroupfs is mounted in the cell, and a trial that set its
// pids.max to 300 from inside still lost the sandbox to a fork bomb; the
// driver does not use it. Guest RLIMIT_NPROC is not enforced by gVisor.
//
// # Disk
//
// A cell's writable storage lives in its sandbox's memory, so it is
// bounded below that memory: Config.CellDiskBytes (the pool key
// cell_disk_bytes, CONTRACT §25; default half of MemoryLimitBytes, and New
// refuses a value not below it, naming the key). gVisor's tmpfs bounds
// each file system on its own, with no budget shared between them, so the
// bytes are split into per-place sizes that make CellDiskBytes together
// (in whole 4 KiB pages; what rounding leaves goes to /home/cell), in
// sixteenths, and in MiB at the default 512 MiB of memory (256 MiB):
//
//	place        rootfs (default or operator's)   with Config.Image
//	/home/cell   6/16  96 MiB                     4/16  64 MiB
//	/tmp         4/16  64 MiB                     3/16  48 MiB
//	/var/tmp     4/16  64 MiB                     3/16  48 MiB
//	/dev/shm     2/16  32 MiB                     2/16  32 MiB
//	/ (upper)    read-only                        4/16  64 MiB
//
// (/var/tmp holds Inspect AI's sandbox tools, about 33 MB unpacked.)
// Each is a tmpfs mounted with size=<its share> (the image's root through
// runsc's --overlay2=root:memory,size=…), and `df` in the cell reports
// each one's size. A write past a place's size fails with ENOSPC
// in the cell (a files/write answers 507 insufficient_storage) and the
// cell lives: TestCellDiskFull fills every place at once. Before these
// bounds each place reported half the host's memory (an image's root 8
// EiB), and filling them killed the cell. /dev, gVisor's devtmpfs, takes
// no size option, so it is mounted read-only (its devices, /dev/pts and
// /dev/shm work as before; root can no longer create files there). The
// cell's host directory at /run/sandboxwich is a 64 KiB host tmpfs,
// root's.
//
// These bounds are gVisor's own, enforced by its kernel in the sandbox,
// so they hold where cgroups are unavailable too. What does not hold
// there is the memory limit (see above: --ignore-cgroups): the sandbox's
// memory, and so a cell that fills its storage and its memory, is then
// bounded only by the host.
//
// Exec timeouts and expiry are the agent's: it kills a timed-out
// command's whole process tree, and at expiry and release every process
// of the cell. A fork bomb left running in the background ends when the
// process limit ends the sandbox (the cell is then lost, as above).
//
// # What a cell can see
//
// With Config.Image, the cell's / is the image under its private writable
// layer (see "Cell images"), plus the mounts below.
//
// With an operator-provided Config.RootFS, the cell's / is that directory,
// read-only (it is shared by all cells), plus the mounts below (runsc makes
// their mount points in the root's overlay). It needs uname (Inspect's
// check) and whatever the workloads run: a static busybox alone serves.
//
// With the default root filesystem (Config.RootFS ""), the cell sees
// exactly this, and nothing else of the host:
//
//   - /usr: the host's /usr, bind-mounted read-only (nosuid, nodev) — the
//     host's installed programs and libraries, /usr/local included;
//   - /bin, /sbin, /lib, /lib32, /lib64, /libx32: on a merged-/usr host
//     (Debian since bookworm) the same symlinks into /usr the host has;
//     on another host each one that is a directory is bind-mounted
//     read-only like /usr;
//   - /etc: synthetic, read-only, seven files written by the driver —
//     passwd (root, cell with uid 1000 and home /home/cell, nobody), group,
//     hostname ("cell"), hosts (localhost only), an empty resolv.conf,
//     nsswitch.conf and an os-release naming a "Sandboxwich cell" (ID
//     sandboxwich; harnesses such as Inspect AI read it). No shadow, no
//     host configuration, no certificates;
//   - /root: an empty directory (mode 0700);
//   - /tmp and /var/tmp (mode 1777) and /home/cell (mode 0700, owned by
//     the cell user): fresh, private tmpfs file systems (/var/tmp is where
//     Inspect AI's bash_session and text_editor tools install themselves;
//     /var holds nothing else), the only writable places besides
//     /dev/shm and, for root, /run/sandboxwich. They live in the
//     sandbox's memory, sized as "Disk" says, and vanish with it;
//   - /.sandboxwich/agent: the cell agent, read-only; /run/sandboxwich: the
//     cell's host directory (see "The cell agent"), mode 0700, root's;
//   - /proc, /sys, /dev, /dev/pts, /dev/shm: gVisor's own, emulated inside
//     the sandbox (/dev read-only, see "Disk"). /proc shows only the cell's processes; /dev holds null,
//     zero, full, random, urandom, tty, ptmx, pts, shm, fuse, net/tun and
//     the fd, stdin, stdout and stderr links.
//
// Not visible: the host's /etc (so no /etc/shadow, keys or configuration),
// /root, /home, /var (the cell's /var holds only its private /var/tmp),
// /run, /srv, /opt, /mnt, /media, /boot, /tmp, the driver's state and
// bundle directories (but the cell's own host directory), any working
// tree, other cells' files and processes, and the host's environment.
//
// The agent runs with the environment
// PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin,
// HOME=/home/cell and TERM=dumb and nothing else; workloads get the
// agent's base environment plus what a request adds, as uid 1000 / gid
// 1000 ("cell") with no capabilities by default, or as root with the
// agent's capabilities, always with no_new_privs. The hostname is "cell".
// With Network "none" the only interface is loopback.
//
// With the pinned runsc, `ls` and `stat` work in a cell; `ls -l /` prints
// "ls: /root: Permission denied" (exit 0), as gVisor refuses the cell user
// the extended-attribute look-up on the 0700 /root. Debian's runsc 20221219
// breaks `ls` and `stat` altogether (see above).
//
// # Life cycle
//
// A cell's container ID is "sbw-<installation>-<cell-uuid>", where
// <installation> is Config.Installation, the plane's 12-hex-digit
// installation tag (driver.InstallationTag of store.Installation), so
// Provision is idempotent per cell ID and List maps containers back to
// cells. The pool is recorded in the spec's annotations
// (dev.sandboxwich.pool, with dev.sandboxwich.installation and
// dev.sandboxwich.cell-id), and List returns only containers of this
// installation and pool: two planes sharing a host and a state root (two
// `sandboxwich dev` in different directories, both with pool "dev") never
// list, and so never destroy as orphans, each other's cells. The ID holds
// no pool name because runsc puts its control socket at
// <StateDir>/runsc-<container-id>.sock, a path of at most 107 bytes: the
// 53-character ID fits under any StateDir of up to 42 characters (runsc
// falls back to /var/run, /run and /tmp for longer ones), and a pool name
// of 64 characters would not fit anywhere.
//
// The identity is "<container-id>@<nonce>": a random nonce written into the
// spec's annotations at each creation and read back from runsc's state,
// so a container recreated under the same ID has another identity. Inspect,
// Agent and Destroy take the container ID from the recorded identity, so a
// cell provisioned before installation tags ("sbw-<pool>-<cell-uuid>") is
// still verified, run in and destroyed; only an object without an identity
// (a provision that failed before recording it) gets the new name. Such
// old containers are never listed: an orphan among them (left by a crash
// before the upgrade) is not removed by the reconciler; `runsc --root
// <StateDir> list` shows it.
//
// runsc's state is read from runsc's own state file under the state root
// (the file `runsc state` prints), which answers in microseconds where
// `runsc state` is a process start of tens of milliseconds; `runsc state`
// is asked when the file is missing or unreadable, or names a sandbox
// process that is gone, and it alone proves absence. A cell's life starts
// runsc four times: run (`--detach`: create and start in one process), the
// exec of the check below, delete, and the state that proves the container
// gone.
//
// The cell's init is the agent, which reaps orphans. Provision writes the
// bundle and mounts the host directory (a container of the cell found
// there, left by a crash, is returned if running and destroyed if not;
// there is none when runsc has no state file of it), runs `runsc run
// --detach` (create and start), checks state running and waits for the
// agent's answer. Meanwhile it checks from inside, with runsc exec, before
// any tenant runs anything there: the kernel release the cell sees
// (`uname -r`, 4.19.0-gvisor under the pinned runsc, 4.4.0 under
// Debian's) must differ from the host's, and the container's PID must be a
// runsc-sandbox process. Inspect reads the state and reports
// gvisor_lower_risk only for a container whose identity passed that check
// (running it itself when Provision's did not run or failed). Destroy runs
// `runsc delete --force` (which SIGKILLs the sandbox and its gofer and
// waits for them), then proves absence: `runsc state` must say the
// container does not exist and no host process may name the container
// under the state root (left-overs are killed after a grace period); then
// the host directory is unmounted and the bundle removed.
// Anything less wraps
// driver.ErrUncertain.
package gvisor
