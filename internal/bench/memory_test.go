package bench

import (
	"os"
	"os/exec"
	"testing"

	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

func TestSameMemory(t *testing.T) {
	self := os.Getpid()
	if !sameMemory(self, self) {
		t.Fatal("a process does not share its own address space (kcmp KCMP_VM failed)")
	}
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	if sameMemory(self, cmd.Process.Pid) {
		t.Fatal("a child process shares this address space")
	}
}

// TestMemory measures real cells: each address space once, the cell and
// the bare container beside each other. Counted per process, or the cell
// alone against a bare container beside it, one cell measured more than
// twice the bare container (2.18 on this machine, before both fixes).
func TestMemory(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil || os.Geteuid() != 0 {
		testenv.Need(t, "runsc and root (scripts/install-runsc.sh)", os.ErrNotExist)
	}
	rep, err := benchMemory(t.Context(), t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cell %d KiB, bare %d KiB (×%.3f), %d KiB a cell in a pool of %d", rep.CellKiB, rep.BareKiB, rep.Ratio, rep.PoolCellKiB, rep.PoolCells)
	switch {
	case rep.BareKiB <= 0 || rep.CellKiB <= rep.BareKiB:
		t.Fatalf("a cell (%d KiB) measured no more than a bare container running sleep (%d KiB)", rep.CellKiB, rep.BareKiB)
	case rep.Ratio >= 2:
		t.Fatalf("a cell measured ×%.3f a bare container: an address space or a shared page counted twice", rep.Ratio)
	case rep.PoolCellKiB <= 0 || rep.PoolCellKiB > rep.CellKiB:
		t.Fatalf("a cell in a pool (%d KiB) costs more than a cell alone (%d KiB)", rep.PoolCellKiB, rep.CellKiB)
	}
}
