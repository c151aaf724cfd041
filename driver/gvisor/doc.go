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
// bookworm /usr (TestLsAndStat catches such a runsc).
//
// # Settings
//
// A pool of provider "gvisor" takes the settings runsc, state_dir,
// bundle_dir, rootfs, network, platform, memory_limit_bytes, cpus and
// pids_limit (SANDBOXWICH_GVISOR_<KEY> for the environment's pool), the
// Config fields of the same names.
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
// paths, container IDs and PIDs; an exec's argv and env travel in a 0600
// process-spec file (runsc exec --process).
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
// threads it needs and dies. The exec then fails with ErrSandboxLost (the
// cell is lost: quarantine it and destroy it; Destroy proves it gone), and
// the host is unharmed. gVisor's own sentry-side pids controller would
// fail guest forks with EAGAIN instead, but runsc does not seed it from
// the spec (it seeds only the CPU and memory controllers), it charges tasks
// only when cgroupfs is mounted in the cell, and a trial that set its
// pids.max to 300 from inside still lost the sandbox to a fork bomb; the
// driver does not use it. Guest RLIMIT_NPROC is not enforced by gVisor.
//
// Exec timeouts: the command runsc exec starts leads its own session and
// process group inside the sandbox. At a timeout (or a cancelled context)
// the driver sends KILL to that group (runsc kill --pgid, delivered by the
// sentry in one step, so it reaches processes orphaned and reparented to
// the cell's init) and to every descendant of the command or of a group
// member that moved to another group, and looks again up to five times.
// Only a process that both left the group (setpgid, setsid) and lost its
// parent in the tree escapes; the process limit still bounds it and it
// ends with the cell. When the command's direct child exits on its own, the
// exec ends there (CONTRACT §14) and what it left in the background keeps
// running, so `b(){ b|b& }; b` returns as soon as its shell exits (0.6 s
// in the incident) and its bomb runs on until the process limit ends the
// sandbox.
//
// # What a cell can see
//
// With an operator-provided Config.RootFS, the cell's / is that directory,
// read-only (it is shared by all cells), plus the mounts below. It needs
// /bin/sh, sleep and uname.
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
//   - /etc: synthetic, read-only, six files written by the driver —
//     passwd (root, cell with uid 1000 and home /home/cell, nobody), group,
//     hostname ("cell"), hosts (localhost only), an empty resolv.conf and
//     nsswitch.conf. No shadow, no host configuration, no certificates;
//   - /root: an empty directory (mode 0700);
//   - /tmp (mode 1777) and /home/cell (mode 0700, owned by the cell user):
//     fresh, private tmpfs file systems, the only writable places besides
//     /dev/shm. They live in the sandbox's memory and vanish with it;
//   - /proc, /sys, /dev, /dev/pts, /dev/shm: gVisor's own, emulated inside
//     the sandbox. /proc shows only the cell's processes; /dev holds null,
//     zero, full, random, urandom, tty, ptmx, pts, shm, fuse, net/tun and
//     the fd, stdin, stdout and stderr links.
//
// Not visible: the host's /etc (so no /etc/shadow, keys or configuration),
// /root, /home, /var, /run, /srv, /opt, /mnt, /media, /boot, /tmp, the
// driver's state and bundle directories, any working tree, other cells'
// files and processes, and the host's environment.
//
// Every cell process runs as uid 1000 / gid 1000 ("cell") with no
// capabilities and no_new_privs, in /home/cell, with the environment
// PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin,
// HOME=/home/cell and TERM=dumb, plus what an exec request adds. The
// hostname is "cell". With Network "none" the only interface is loopback.
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
// spec's annotations at each creation and read back through `runsc state`,
// so a container recreated under the same ID has another identity. Inspect,
// Exec and Destroy take the container ID from the recorded identity, so a
// cell provisioned before installation tags ("sbw-<pool>-<cell-uuid>") is
// still verified, run in and destroyed; only an object without an identity
// (a provision that failed before recording it) gets the new name. Such
// old containers are never listed: an orphan among them (left by a crash
// before the upgrade) is not removed by the reconciler; `runsc --root
// <StateDir> list` shows it.
//
// The cell's init is a shell loop that sleeps and reaps orphans. Provision
// writes the bundle, runs `runsc create` and `runsc start` and waits for
// state running. Inspect reads `runsc state` and then checks from inside:
// the kernel release the cell sees (`uname -r`, 4.19.0-gvisor under the pinned runsc, 4.4.0 under Debian's) must
// differ from the host's, and the container's PID must be a runsc-sandbox
// process; only then does it report gvisor_lower_risk. Destroy runs `runsc
// kill KILL` and `runsc delete --force`, then proves absence: `runsc
// state` must say the container does not exist and no host process may name
// the container under the state root (left-overs are killed after a grace
// period); then the bundle is removed. Anything less wraps
// driver.ErrUncertain.
package gvisor
