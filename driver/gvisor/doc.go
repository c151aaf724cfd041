// Package gvisor is the local driver: each sterile cell is an OCI container
// run by gVisor's runsc on this host, serving the runtime class
// gvisor_lower_risk (a shared host kernel behind gVisor's user-space
// kernel).
//
// Install runsc with `apt-get install -y runsc` (Debian bookworm ships
// gVisor release 20221219), or run scripts/install-runsc.sh.
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
//	--platform=<P>      only when Config.Platform is set; the default
//	                    (ptrace in this runsc) needs no /dev/kvm and works
//	                    in containers and VMs alike (kvm hung at create on
//	                    the nested-virtualisation machine this was built on)
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
// logs a warning: no memory or CPU limit is then enforced on the host, and
// the guest sees the host's memory size.
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
// Known limitation of runsc 20221219: its statx rejects the
// AT_NO_AUTOMOUNT flag that GNU coreutils 9 (`ls`, `stat`) pass, so those
// two commands fail with "Invalid argument" inside a cell built on a
// Debian bookworm /usr. Shells, cat, find, python3 and most programs are
// unaffected.
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
// the kernel release the cell sees (`uname -r`, 4.4.0 under gVisor) must
// differ from the host's, and the container's PID must be a runsc-sandbox
// process; only then does it report gvisor_lower_risk. Destroy runs `runsc
// kill KILL` and `runsc delete --force`, then proves absence: `runsc
// state` must say the container does not exist and no host process may name
// the container under the state root (left-overs are killed after a grace
// period); then the bundle is removed. Anything less wraps
// driver.ErrUncertain.
package gvisor
