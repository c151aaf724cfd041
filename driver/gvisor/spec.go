package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/egress"
)

// The subset of the OCI runtime specification the driver writes.

type ociSpec struct {
	Version     string            `json:"ociVersion"`
	Process     *ociProcess       `json:"process"`
	Root        ociRoot           `json:"root"`
	Hostname    string            `json:"hostname"`
	Mounts      []ociMount        `json:"mounts"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Linux       ociLinux          `json:"linux"`
}

type ociProcess struct {
	Terminal        bool            `json:"terminal"`
	User            ociUser         `json:"user"`
	Args            []string        `json:"args"`
	Env             []string        `json:"env"`
	Cwd             string          `json:"cwd"`
	Capabilities    ociCapabilities `json:"capabilities"`
	NoNewPrivileges bool            `json:"noNewPrivileges"`
}

type ociUser struct {
	UID uint32 `json:"uid"`
	GID uint32 `json:"gid"`
}

// ociCapabilities are a process's capability sets.
type ociCapabilities struct {
	Bounding    []string `json:"bounding"`
	Effective   []string `json:"effective"`
	Inheritable []string `json:"inheritable"`
	Permitted   []string `json:"permitted"`
	Ambient     []string `json:"ambient"`
}

type ociRoot struct {
	Path     string `json:"path"`
	Readonly bool   `json:"readonly"`
}

type ociMount struct {
	Destination string   `json:"destination"`
	Type        string   `json:"type"`
	Source      string   `json:"source"`
	Options     []string `json:"options,omitempty"`
}

type ociLinux struct {
	Resources  ociResources   `json:"resources"`
	Namespaces []ociNamespace `json:"namespaces"`
}

type ociResources struct {
	Memory *ociMemory `json:"memory,omitempty"`
	CPU    *ociCPU    `json:"cpu,omitempty"`
	Pids   *ociPids   `json:"pids,omitempty"`
}

type ociPids struct {
	Limit int64 `json:"limit"`
}

type ociMemory struct {
	Limit int64 `json:"limit"`
}

type ociCPU struct {
	Quota  int64  `json:"quota"`
	Period uint64 `json:"period"`
}

type ociNamespace struct {
	Type string `json:"type"`
	// Path joins an existing namespace (a cell's egress namespace).
	Path string `json:"path,omitempty"`
}

// Inside every cell.
const (
	cellUID      = 1000
	cellGID      = 1000
	cellHome     = "/home/cell"
	cellHostname = "cell"
	cellPath     = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// nonceAnnotation carries the per-provision nonce that makes a
	// container's identity; runsc reports it back in state and list.
	nonceAnnotation = "dev.sandboxwich.nonce"
	// cellAnnotation, poolAnnotation and installationAnnotation label the
	// container; List selects on the pool's.
	cellAnnotation         = "dev.sandboxwich.cell-id"
	poolAnnotation         = "dev.sandboxwich.pool"
	installationAnnotation = "dev.sandboxwich.installation"
	cpuPeriod              = 100000 // µs
)

// cellEnv is the fixed environment of every process in a cell. Nothing of
// the host's environment is added.
var cellEnv = []string{"PATH=" + cellPath, "HOME=" + cellHome, "TERM=dumb"}

// The cell agent inside every cell (see "The cell agent" in the package
// documentation).
const (
	// agentInCell is where the agent binary is mounted, read-only.
	agentInCell = "/.sandboxwich/agent"
	// agentDirInCell is where the cell's host directory is mounted; the
	// agent listens on agentSocket in it.
	agentDirInCell = "/run/sandboxwich"
	agentSocket    = "agent.sock"
	// agentRecord is the file of the host directory the agent appends
	// every message it receives to, with Config.RecordAgentMessages.
	agentRecord = "agent-messages"
	// agentDigestAnnotation records the digest of the agent binary
	// mounted into the container; Inspect reads it back from runsc.
	agentDigestAnnotation = "dev.sandboxwich.agent-digest"
	// hostDirName is the cell's host directory inside its bundle.
	hostDirName = "run"
)

// agentCapabilities are the capabilities of the agent, the cell's init,
// and so of root workloads (which inherit them); cell-user workloads (uid
// 1000) hold none. Each is needed for something the agent does:
//
//   - CAP_SETUID, CAP_SETGID: start workloads and do file operations as
//     the cell user (setuid, setgid, setgroups).
//   - CAP_KILL: kill the cell user's processes at a timeout, at expiry and
//     at release.
//   - CAP_CHOWN: give the cell user the files and parent directories it
//     writes as that user, and the launch output files.
//   - CAP_DAC_OVERRIDE: act as root on files whatever their mode (root's
//     reads and writes, the 0700 home of the cell user).
//   - CAP_FOWNER: set the mode of files root does not own (a root write
//     over a cell user's file; chmod by root workloads).
//
// Left out: CAP_FSETID (set-id bits are inert under no_new_privs),
// CAP_SETPCAP (a workload that switches to the cell user loses every
// capability anyway, and nothing can gain one back under no_new_privs),
// and everything that reaches beyond files and processes (CAP_SYS_*,
// CAP_NET_*, CAP_MKNOD, CAP_SYS_PTRACE: nothing may trace the agent).
var agentCapabilities = []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID"}

// agentProcess is the process spec of the cell's init: the agent, as root
// with agentCapabilities and no_new_privs.
func agentProcess(cellID string, record bool) *ociProcess {
	args := []string{agentInCell, "-listen", agentDirInCell + "/" + agentSocket, "-cell-id", cellID}
	if record {
		args = append(args, "-record", agentDirInCell+"/"+agentRecord)
	}
	caps := agentCapabilities
	return &ociProcess{
		User: ociUser{UID: 0, GID: 0},
		Args: args,
		Env:  cellEnv,
		Cwd:  "/",
		Capabilities: ociCapabilities{Bounding: caps, Effective: caps, Permitted: caps,
			Inheritable: []string{}, Ambient: []string{}},
		NoNewPrivileges: true,
	}
}

// process returns the process spec of a cell-user process running args:
// uid 1000, no capabilities, no_new_privs. Only the provider's own
// read-back from inside runs such a process through runsc exec.
func process(args, env []string) *ociProcess {
	empty := []string{}
	return &ociProcess{
		User:         ociUser{UID: cellUID, GID: cellGID},
		Args:         args,
		Env:          env,
		Cwd:          cellHome,
		Capabilities: ociCapabilities{empty, empty, empty, empty, empty},
		// setuid binaries in a bind-mounted /usr grant nothing.
		NoNewPrivileges: true,
	}
}

// spec returns the OCI spec of one cell whose host directory is hostDir,
// whose root is img's (nil: the default or operator's root filesystem).
func (p *Provider) spec(cellID, nonce, hostDir string, img *imageStore) ociSpec {
	// Every writable place is bounded, together by Config.CellDiskBytes
	// (see diskShares); the image's writable root by runsc's
	// --overlay2=root:memory,size=….
	disk := diskShares(p.cfg.CellDiskBytes, img != nil)
	mounts := []ociMount{
		{Destination: "/proc", Type: "proc", Source: "proc"},
		// Read-only: gVisor's devtmpfs takes no size, so root in the cell
		// could fill it past the cell's disk; its devices stay usable.
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "mode=755", "ro"}},
		{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", sizeOption(disk[diskShm])}},
		{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
	}
	if img == nil {
		mounts = append(mounts, p.hostMounts...) // the default root filesystem's
	}
	mounts = append(mounts,
		ociMount{Destination: diskTmp, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", sizeOption(disk[diskTmp])}},
		// Inspect AI's bash_session and text_editor tools install
		// themselves under /var/tmp (and need it executable).
		ociMount{Destination: diskVarTmp, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", sizeOption(disk[diskVarTmp])}},
		ociMount{Destination: diskHome, Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=0700",
			fmt.Sprintf("uid=%d", cellUID), fmt.Sprintf("gid=%d", cellGID), sizeOption(disk[diskHome])}},
		// runsc makes both mount points in the root's overlay, on the
		// default root filesystem and an operator's alike.
		ociMount{Destination: agentInCell, Type: "bind", Source: p.agent.path, Options: []string{"bind", "ro", "nosuid", "nodev"}},
		ociMount{Destination: agentDirInCell, Type: "bind", Source: hostDir, Options: []string{"bind", "rw", "nosuid", "nodev", "noexec"}},
	)
	annotations := map[string]string{
		nonceAnnotation: nonce,
		cellAnnotation:  cellID,
		poolAnnotation:  p.cfg.Pool,
		// The container ID carries it too; this says what it is.
		installationAnnotation: p.cfg.Installation,
		agentDigestAnnotation:  p.agent.digest,
	}
	root := ociRoot{Path: p.rootfs, Readonly: true}
	if img != nil {
		root.Path = img.rootfs()
		annotations[imageDigestAnnotation] = img.digest
		// Writable through the cell's private upper layer in memory
		// (--overlay2=root:memory); the shared image below is never
		// written.
		root.Readonly = false
	}
	return ociSpec{
		Version:     "1.0.2",
		Process:     agentProcess(cellID, p.cfg.RecordAgentMessages),
		Root:        root,
		Hostname:    cellHostname,
		Mounts:      mounts,
		Annotations: annotations,
		Linux: ociLinux{
			Resources: ociResources{
				Memory: &ociMemory{Limit: p.cfg.MemoryLimitBytes},
				CPU:    &ociCPU{Quota: int64(p.cfg.CPUs * cpuPeriod), Period: cpuPeriod},
				Pids:   &ociPids{Limit: p.cfg.PidsLimit},
			},
			Namespaces: []ociNamespace{{Type: "pid"}, {Type: "ipc"}, {Type: "uts"}, {Type: "mount"}, {Type: "network"}},
		},
	}
}

// egressSpec puts the cell in a network namespace of its own on the
// egress net, with policy pol, and points its resolver at the gateway (on
// the default root filesystem, whose synthetic nsswitch.conf looks up
// hosts in files only, its hosts in DNS too).
func (p *Provider) egressSpec(ctx context.Context, spec *ociSpec, cell uuid.UUID, bundle string, img *imageStore, pol egress.Policy) error {
	ns, err := p.cfg.Egress.Attach(ctx, cell, pol)
	if err != nil {
		return err
	}
	resolv := filepath.Join(bundle, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver "+p.cfg.Egress.cfg.Address.String()+"\n"), 0o644); err != nil {
		return err
	}
	spec.Mounts = append(spec.Mounts, ociMount{Destination: "/etc/resolv.conf", Type: "bind", Source: resolv,
		Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	if img == nil {
		nss := filepath.Join(bundle, "nsswitch.conf")
		if err := os.WriteFile(nss, []byte(strings.Replace(syntheticEtc["nsswitch.conf"], "hosts: files\n", "hosts: files dns\n", 1)), 0o644); err != nil {
			return err
		}
		spec.Mounts = append(spec.Mounts, ociMount{Destination: "/etc/nsswitch.conf", Type: "bind", Source: nss,
			Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"}})
	}
	for i := range spec.Linux.Namespaces {
		if spec.Linux.Namespaces[i].Type == "network" {
			spec.Linux.Namespaces[i].Path = ns
		}
	}
	return nil
}

// writeJSON writes v to path, readable by the owner only.
func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// Default root filesystem.

// defaultRootFSDir is the directory under BundleDir that holds the default
// root filesystem's skeleton. Container IDs start with "sbw-", so it never
// collides with a bundle.
const defaultRootFSDir = "default-rootfs"

// hostSystemDirs are the host directories the default root filesystem
// shows, read-only. A symlink among them (a merged-/usr host) is recreated
// as the same symlink instead.
var hostSystemDirs = []string{"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"}

// syntheticEtc is the whole /etc of the default root filesystem.
var syntheticEtc = map[string]string{
	"passwd": "root:x:0:0:root:/root:/bin/sh\n" +
		fmt.Sprintf("cell:x:%d:%d:cell:%s:/bin/sh\n", cellUID, cellGID, cellHome) +
		"nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
	"group":         fmt.Sprintf("root:x:0:\ncell:x:%d:\nnogroup:x:65534:\n", cellGID),
	"hostname":      cellHostname + "\n",
	"hosts":         "127.0.0.1\tlocalhost " + cellHostname + "\n::1\tlocalhost ip6-localhost ip6-loopback\n",
	"resolv.conf":   "",
	"nsswitch.conf": "passwd: files\ngroup: files\nshadow: files\nhosts: files\n",
	// Harnesses read it to pick what to install (Inspect AI's tool
	// injection fails without one); the programs are the host's /usr.
	"os-release": "NAME=\"Sandboxwich cell\"\nID=sandboxwich\nPRETTY_NAME=\"Sandboxwich cell (the host's /usr, read-only)\"\n",
}

// buildDefaultRootFS lays out the default root filesystem's skeleton under
// dir (synthetic /etc, empty mount points, symlinks of a merged-/usr host)
// and returns the read-only bind mounts of the host's system directories
// that complete it. hostRoot is "/" except in tests. It only writes what
// differs, so running containers that serve the skeleton are not disturbed.
func buildDefaultRootFS(dir, hostRoot string) ([]ociMount, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	for _, d := range []string{"etc", "proc", "dev", "sys", "tmp", "root", "home", "home/cell"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if err := os.Chmod(filepath.Join(dir, "root"), 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(filepath.Join(dir, "tmp"), 0o1777); err != nil {
		return nil, err
	}
	for name, content := range syntheticEtc {
		if err := writeIfChanged(filepath.Join(dir, "etc", name), []byte(content)); err != nil {
			return nil, err
		}
	}
	var mounts []ociMount
	for _, name := range hostSystemDirs {
		host := filepath.Join(hostRoot, name)
		fi, err := os.Lstat(host)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		inside := filepath.Join(dir, name)
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(host)
			if err != nil {
				return nil, err
			}
			// Only links into the exposed /usr are recreated; anything
			// else would point at nothing inside the cell.
			clean := filepath.Clean(target)
			if !strings.HasPrefix(clean, "usr/") && !strings.HasPrefix(clean, "/usr/") {
				continue
			}
			if cur, err := os.Readlink(inside); err == nil && cur == target {
				continue
			}
			_ = os.RemoveAll(inside)
			if err := os.Symlink(target, inside); err != nil {
				// Another provider may have made the same link meanwhile.
				if cur, rerr := os.Readlink(inside); rerr != nil || cur != target {
					return nil, err
				}
			}
		case fi.IsDir():
			if err := os.MkdirAll(inside, 0o755); err != nil {
				return nil, err
			}
			mounts = append(mounts, ociMount{
				Destination: "/" + name, Type: "bind", Source: host,
				Options: []string{"rbind", "ro", "nosuid", "nodev"},
			})
		}
	}
	return mounts, nil
}

// writeIfChanged writes a world-readable file unless it already holds
// content. The write is atomic, so providers built concurrently over the
// same directory do not see half-written files.
func writeIfChanged(path string, content []byte) error {
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, content) {
		return nil
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(content)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	return err
}
