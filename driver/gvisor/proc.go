package gvisor

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// hostProcess is a process on the host that belongs to a container.
type hostProcess struct {
	pid  int
	argv []string
}

// containerProcesses scans the host's /proc (procRoot, "/proc" except in
// tests) for processes that belong to container id under the runsc state
// root: any process run with --root=<root> whose arguments name the
// container ID or its bundle directory. That covers runsc's sandbox
// ("runsc-sandbox … boot … <id>"), its gofer ("runsc-gofer … gofer --bundle
// <bundle>") and every runsc command for the container.
func containerProcesses(procRoot, root, id, bundle string) ([]hostProcess, error) {
	entries, err := os.ReadDir(procRoot)
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var found []hostProcess
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(procRoot, e.Name(), "cmdline"))
		if err != nil || len(raw) == 0 {
			continue // gone, or a kernel thread or zombie
		}
		argv := strings.Split(string(bytes.TrimRight(raw, "\x00")), "\x00")
		if belongs(argv, root, id, bundle) {
			found = append(found, hostProcess{pid: pid, argv: argv})
		}
	}
	return found, nil
}

// belongs reports whether a command line is a runsc process of container id
// under state root root.
func belongs(argv []string, root, id, bundle string) bool {
	hasRoot, hasID := false, false
	for i, a := range argv {
		switch {
		case a == "--root="+root || a == "-root="+root ||
			((a == "--root" || a == "-root") && i+1 < len(argv) && argv[i+1] == root):
			hasRoot = true
		case i > 0 && a == id:
			hasID = true
		case a == "--bundle="+bundle || a == "-bundle="+bundle ||
			((a == "--bundle" || a == "-bundle") && i+1 < len(argv) && argv[i+1] == bundle):
			hasID = true
		}
	}
	return hasRoot && hasID
}
