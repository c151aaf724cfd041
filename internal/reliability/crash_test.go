package reliability

import (
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestWrongImages: a lease on a cell of its claim's image passes; one on a
// cell of another image, or of none, is a violation; leases the snapshot
// does not hold are lostAcks' to report, not this check's.
func TestWrongImages(t *testing.T) {
	s := Snapshot{Cells: map[string]CellRow{
		"c1": {ID: "c1", State: "leased", Lease: "l1", Image: "reg/a@sha256:1"},
		"c2": {ID: "c2", State: "leased", Lease: "l2", Image: "reg/b@sha256:2"},
		"c3": {ID: "c3", State: "destroyed", Lease: "l3"},
	}}
	if v := wrongImages(map[string]string{"l1": "reg/a@sha256:1", "l2": "reg/b@sha256:2", "gone": "reg/a@sha256:1"}, s); len(v) != 0 {
		t.Fatalf("matching images: %v", v)
	}
	v := wrongImages(map[string]string{"l1": "reg/b@sha256:2", "l3": "reg/a@sha256:1"}, s)
	if len(v) != 2 || !strings.Contains(strings.Join(v, "\n"), "lease l1 is on cell c1 of image \"reg/a@sha256:1\"") {
		t.Fatalf("mismatched images: %v, want l1 and l3 reported", v)
	}
}

// TestRunscProcesses: a process run with --root=<root> is found (by either
// spelling), one of another root is not, and none is once it exited.
func TestRunscProcesses(t *testing.T) {
	root := t.TempDir()
	cmd := exec.Command("sh", "-c", "sleep 30", "runsc-sandbox", "--root="+root, "boot", "sbw-x")
	other := exec.Command("sh", "-c", "sleep 30", "runsc-sandbox", "--root", root+"-other", "boot", "sbw-y")
	for _, c := range []*exec.Cmd{cmd, other} {
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Process.Kill(); _ = c.Wait() })
	}
	if got := runscProcesses(root, 0); len(got) != 1 || !strings.HasPrefix(got[0], strconv.Itoa(cmd.Process.Pid)+" ") {
		t.Fatalf("found %v, want pid %d", got, cmd.Process.Pid)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	if got := runscProcesses(root, time.Second); len(got) != 0 {
		t.Fatalf("found %v after the process exited", got)
	}
}
