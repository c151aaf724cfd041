package bench

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// TestEgressBench runs the egress figure on real gVisor cells: every turn
// measured both ways, and no namespace of it left behind. (The ratio is
// the bench's to judge, never a test's.)
func TestEgressBench(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil || os.Geteuid() != 0 {
		testenv.Need(t, "runsc and root (scripts/install-runsc.sh)", os.ErrNotExist)
	}
	if testing.Short() {
		t.Skip("starts real gVisor sandboxes")
	}
	rep, err := benchEgress(t.Context(), t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("provision with an allow-list p50 %.1f ms, without %.1f ms (×%.3f)", rep.Allow.P50MS, rep.None.P50MS, rep.ProvisionRatio)
	if rep.Allow.N != 4 || rep.None.N != 4 || rep.ProvisionRatio <= 0 {
		t.Errorf("egress figure %+v, want 4 turns each way", rep)
	}
	after, err := exec.Command("ip", "netns", "list").Output()
	if err != nil || strings.Contains(string(after), "sbw-"+rep.name+"-") {
		t.Errorf("namespaces of the figure's egress net %s left (%v):\n%s", rep.name, err, after)
	}
}
