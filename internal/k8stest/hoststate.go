package k8stest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"
)

// nodeSysctls are the host sysctls the kubelet sets at start
// (vm.overcommit_memory=1, kernel.panic=10, kernel.panic_on_oops=1);
// teardown writes the old values back.
var nodeSysctls = []string{"vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"}

// nodePaths are the fixed host paths containerd, its shims, runsc, the CNI
// plugin and the kubelet create whatever their configured folders are.
var nodePaths = []string{
	"/run/containerd",
	"/run/netns",
	"/run/nri",
	"/var/lib/cni",
	"/var/lib/kubelet",
	"/var/log/containers",
	"/var/log/pods",
	"/opt/containerd",
	"/usr/libexec/kubernetes",
	"/etc/cni",
	"/var/run/secrets",
}

// HostState is what a real node may change on the host: the values of the
// sysctls the kubelet sets, which of the fixed paths exist, the mounts
// under them or under a node's work folder (other programs' network
// namespaces aside), the kubelet's cgroups, the node's interfaces in the
// host network namespace, and the processes running the node's binaries.
type HostState struct {
	Sysctls map[string]string
	Paths   []string
	Mounts  []string
	Cgroups []string
	Links   []string
	Procs   []int
}

// SnapshotHost records the HostState, with the processes of the binaries
// under nodeBin.
func SnapshotHost(nodeBin string) HostState {
	s := HostState{Sysctls: map[string]string{}}
	for _, k := range nodeSysctls {
		b, _ := os.ReadFile(filepath.Join("/proc/sys", k))
		s.Sysctls[k] = strings.TrimSpace(string(b))
	}
	for _, p := range nodePaths {
		if _, err := os.Lstat(p); err == nil {
			s.Paths = append(s.Paths, p)
		}
	}
	s.Mounts = slices.DeleteFunc(nodeMounts(""), foreignNetNS)
	s.Cgroups = kubeCgroups()
	s.Links = hostLinks()
	s.Procs = nodePIDs(nodeBin)
	return s
}

// Diff describes how t differs from s, or returns "".
func (s HostState) Diff(t HostState) string {
	var d []string
	for _, k := range nodeSysctls {
		if s.Sysctls[k] != t.Sysctls[k] {
			d = append(d, fmt.Sprintf("sysctl %s %s → %s", k, s.Sysctls[k], t.Sysctls[k]))
		}
	}
	list := func(what string, a, b []string) {
		for _, x := range b {
			if !slices.Contains(a, x) {
				d = append(d, what+" added: "+x)
			}
		}
		for _, x := range a {
			if !slices.Contains(b, x) {
				d = append(d, what+" removed: "+x)
			}
		}
	}
	list("path", s.Paths, t.Paths)
	list("mount", s.Mounts, t.Mounts)
	list("cgroup", s.Cgroups, t.Cgroups)
	list("host network interface", s.Links, t.Links)
	if len(t.Procs) > len(s.Procs) {
		d = append(d, fmt.Sprintf("node processes running: %v", t.Procs))
	}
	return strings.Join(d, "; ")
}

// restore undoes what a node changed since s: unmounts what was mounted
// under the fixed paths or work, deletes the node's network namespace,
// removes the fixed paths that did not exist, removes the kubelet's
// cgroups, and writes the sysctls back.
func (s HostState) restore(work string) error {
	var errs []error
	// Deepest first.
	for range 3 {
		ms := nodeMounts(work)
		sort.Sort(sort.Reverse(sort.StringSlice(ms)))
		left := 0
		for _, m := range ms {
			if slices.Contains(s.Mounts, m) || foreignNetNS(m) {
				continue
			}
			left++
			if err := syscall.Unmount(m, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmount %s: %w", m, err))
			}
		}
		if left == 0 {
			break
		}
	}
	ns := filepath.Join("/run/netns", NodeNetNS)
	if _, err := os.Lstat(ns); err == nil {
		_ = syscall.Unmount(ns, syscall.MNT_DETACH)
		if err := os.Remove(ns); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range nodePaths {
		if slices.Contains(s.Paths, p) {
			continue
		}
		if p == "/run/netns" {
			// Only when empty: other programs may pin namespaces there.
			_ = os.Remove(p)
			continue
		}
		if err := os.RemoveAll(p); err != nil {
			errs = append(errs, err)
		}
	}
	for _, cg := range kubeCgroups() {
		if slices.Contains(s.Cgroups, cg) {
			continue
		}
		errs = append(errs, removeCgroup(cg))
	}
	for k, v := range s.Sysctls {
		if v == "" {
			continue
		}
		if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
			errs = append(errs, fmt.Errorf("sysctl %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// foreignNetNS reports whether m is a network namespace under /run/netns
// that neither the node nor its containerd (cni-…) pinned.
func foreignNetNS(m string) bool {
	name, ok := strings.CutPrefix(m, "/run/netns/")
	return ok && name != NodeNetNS && !strings.HasPrefix(name, "cni-")
}

// nodeMounts lists the mount points under the fixed paths, under a node
// work folder (work, or any k8stest-node-* in the temp folder when work is
// ""), or under the netns folder.
func nodeMounts(work string) []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	prefixes := slices.Clone(nodePaths)
	if work != "" {
		prefixes = append(prefixes, work)
	} else {
		prefixes = append(prefixes, filepath.Join(os.TempDir(), "k8stest-node-"))
	}
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		mp := strings.ReplaceAll(fields[4], `\040`, " ")
		for _, p := range prefixes {
			if mp == p || strings.HasPrefix(mp, p) && (strings.HasSuffix(p, "-") || strings.HasPrefix(mp, p+"/")) {
				out = append(out, mp)
				break
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// kubeCgroups lists the kubelet's "kubepods" cgroups, one per hierarchy.
func kubeCgroups() []string {
	var out []string
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	for _, e := range ents {
		if !e.IsDir() { // hierarchies named by symlinks (cpu → cpu,cpuacct) are listed once
			continue
		}
		p := filepath.Join("/sys/fs/cgroup", e.Name(), "kubepods")
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, p)
		}
	}
	if st, err := os.Stat("/sys/fs/cgroup/kubepods"); err == nil && st.IsDir() {
		out = append(out, "/sys/fs/cgroup/kubepods") // cgroup v2
	}
	return out
}

// cgroupPIDs lists the processes in the kubelet's cgroups that are not in
// s (the node made them).
func (s HostState) cgroupPIDs() []int {
	var out []int
	for _, cg := range kubeCgroups() {
		if slices.Contains(s.Cgroups, cg) {
			continue
		}
		_ = filepath.WalkDir(cg, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				var pid int
				if _, err := fmt.Sscan(f, &pid); err == nil && pid != os.Getpid() {
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// linkPrefix starts the name of every interface the node creates (its
// bridge, the Pods' veth peers); all live in NodeNetNS.
const linkPrefix = "k8n"

// hostLinks lists the node's interfaces found in the host's (this
// process's) network namespace: there must be none.
func hostLinks() []string {
	ents, _ := os.ReadDir("/sys/class/net")
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), linkPrefix) {
			out = append(out, e.Name())
		}
	}
	return out
}

// removeCgroup removes a cgroup and its children, depth first.
func removeCgroup(root string) error {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	var last error
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := syscall.Rmdir(dirs[i]); err != nil && !errors.Is(err, syscall.ENOENT) {
			last = fmt.Errorf("rmdir %s: %w", dirs[i], err)
		}
	}
	return last
}

// saveSysctls writes the sysctls' values into the host lock file, which
// teardown empties once it wrote them back.
func (s HostState) saveSysctls(lock *os.File) error {
	var b strings.Builder
	for _, k := range nodeSysctls {
		fmt.Fprintf(&b, "%s=%s\n", k, s.Sysctls[k])
	}
	if err := lock.Truncate(0); err != nil {
		return err
	}
	if _, err := lock.WriteAt([]byte(b.String()), 0); err != nil {
		return err
	}
	return lock.Sync()
}

// cleanStale ends what a node whose test binary died left running: the
// processes of its binaries and of its cgroups, its mounts under
// /run/containerd and /run/netns, its network namespace, /run/containerd
// and its cgroups, when such a process or that namespace exists. The
// sysctls the dead node's kubelet changed get back the values the lock file
// kept (saveSysctls) whenever it holds any.
func cleanStale(nodeBin string, lock *os.File) error {
	if saved, _ := io.ReadAll(io.NewSectionReader(lock, 0, 1<<16)); len(saved) > 0 {
		fmt.Fprintln(os.Stderr, "k8stest: writing back the sysctls a real node whose test binary died left changed")
		for _, line := range strings.Split(strings.TrimSpace(string(saved)), "\n") {
			k, v, ok := strings.Cut(line, "=")
			if ok && slices.Contains(nodeSysctls, k) && v != "" {
				if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0o644); err != nil {
					return fmt.Errorf("sysctl %s: %w", k, err)
				}
			}
		}
		if err := lock.Truncate(0); err != nil {
			return err
		}
	}
	_, nsErr := os.Lstat(filepath.Join("/run/netns", NodeNetNS))
	empty := HostState{}
	if len(nodePIDs(nodeBin)) == 0 && len(empty.cgroupPIDs()) == 0 && nsErr != nil {
		return nil
	}
	fmt.Fprintln(os.Stderr, "k8stest: cleaning up after a real node whose test binary died")
	for range 50 {
		pids := append(nodePIDs(nodeBin), empty.cgroupPIDs()...)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// Every mount of the node goes; of the paths only /run/containerd
	// (shim sockets, runsc state), which the next node needs empty.
	keep := HostState{Paths: slices.DeleteFunc(slices.Clone(nodePaths), func(p string) bool { return p == "/run/containerd" })}
	err := keep.restore("")
	// The dead node's work folders (no live node has one: we hold the
	// lock).
	works, _ := filepath.Glob(filepath.Join(os.TempDir(), "k8stest-node-*"))
	for _, w := range works {
		if len(nodeMounts(w)) == 0 {
			_ = os.RemoveAll(w)
		}
	}
	return err
}

// nodePIDs lists the processes whose executable is under nodeBin.
func nodePIDs(nodeBin string) []int {
	if nodeBin == "" {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil || pid == os.Getpid() {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil {
			continue
		}
		if strings.HasPrefix(exe, nodeBin+"/") {
			out = append(out, pid)
		}
	}
	return out
}
