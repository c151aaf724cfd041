package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/google/uuid"
)

// bare runs runsc itself, with no plane, driver or agent: the baselines
// of the gVisor figures. Its bundle is a copy of a cell's spec whose
// process is argv (as root, like the agent) and which lacks the agent's
// mounts, and it passes the driver's global flags.
type bare struct {
	flags  []string
	bundle string
	log    *os.File
}

// newBare writes the bundle under bundles from the spec of the cell
// bundle cellBundle; overlay is the driver's --overlay2 value ("" for
// runsc's default).
func newBare(stateDir, cellBundle, overlay, bundles string, argv []string) (*bare, error) {
	raw, err := os.ReadFile(filepath.Join(cellBundle, "config.json"))
	if err != nil {
		return nil, err
	}
	var spec map[string]any
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, err
	}
	spec["process"].(map[string]any)["args"] = argv
	var mounts []any
	for _, m := range spec["mounts"].([]any) {
		src, _ := m.(map[string]any)["source"].(string)
		if !strings.HasPrefix(src, filepath.Dir(cellBundle)) && !strings.Contains(src, "agent") {
			mounts = append(mounts, m)
		}
	}
	spec["mounts"] = mounts
	b := &bare{flags: []string{"--root=" + stateDir, "--network=none", "--host-uds=create"},
		bundle: filepath.Join(bundles, "bare-"+uuid.NewString()[:8])} // not the cell's ID: its processes are found by it
	if overlay != "" {
		b.flags = append(b.flags, "--overlay2="+overlay)
	}
	if err := os.MkdirAll(b.bundle, 0o700); err != nil {
		return nil, err
	}
	out, _ := json.Marshal(spec)
	if err := os.WriteFile(filepath.Join(b.bundle, "config.json"), out, 0o600); err != nil {
		return nil, err
	}
	// A container's init inherits create's stdio, so runsc writes to a
	// file: a pipe would stay open for as long as the container runs.
	if b.log, err = os.Create(b.bundle + ".log"); err != nil {
		return nil, err
	}
	return b, nil
}

// runsc runs one runsc command with the driver's global flags.
func (b *bare) runsc(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "runsc", append(b.flags, args...)...)
	cmd.Stdout, cmd.Stderr = b.log, b.log
	if err := cmd.Run(); err != nil {
		out, _ := os.ReadFile(b.log.Name())
		if len(out) > 2048 {
			out = out[len(out)-2048:]
		}
		return fmt.Errorf("runsc %s: %v: %s", args[0], err, bytes.TrimSpace(out))
	}
	return nil
}

// output runs one runsc command with the driver's global flags and
// returns its standard output (runsc's own messages go to the log).
func (b *bare) output(ctx context.Context, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "runsc", append(b.flags, args...)...)
	cmd.Stderr = b.log
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("runsc %s: %v", args[0], err)
	}
	return out, nil
}

// start creates and starts container id.
func (b *bare) start(ctx context.Context, id string) error {
	if err := b.runsc(ctx, "create", "--bundle", b.bundle, id); err != nil {
		return err
	}
	return b.runsc(ctx, "start", id)
}

func (b *bare) close() {
	b.log.Close()
	os.Remove(b.log.Name())
	os.RemoveAll(b.bundle)
}

// sandboxFlag returns the value of the global flag name (such as
// "--overlay2") on the command line of container id's runsc sandbox, as
// the driver started it: a bare container of the cell's spec then runs
// with the cell's own flags.
func sandboxFlag(id, name string) (string, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return "", err
	}
	for _, e := range procs {
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(raw, []byte(id)) || !bytes.Contains(raw, []byte("\x00boot\x00")) {
			continue
		}
		for _, arg := range strings.Split(string(raw), "\x00") {
			if v, ok := strings.CutPrefix(arg, name+"="); ok {
				return v, nil
			}
		}
		return "", nil
	}
	return "", fmt.Errorf("no runsc sandbox of container %s", id)
}
