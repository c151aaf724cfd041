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

// TestMemory runs the memory measurement on real cells and checks what no
// other work on the machine can move: every figure was measured (positive,
// the pool of the size asked for) and each cell's PSS is at most its RSS
// (a page shared is counted in full in RSS and in part in PSS). How a cell
// compares with a bare container (cell_memory_ratio) and with a cell in a
// pool (pool_cell_ratio) are RSS/PSS comparisons between readings taken
// at different moments: a loaded machine moves them (a cold CI run once
// measured a pool cell at 18932 KiB against 18019 KiB alone), so they are
// the bench's figures (sandboxwich bench), not assertions here. That each
// address space is counted once is TestSameMemory's (kcmp), which no load
// can move either.
func TestMemory(t *testing.T) {
	if _, err := exec.LookPath("runsc"); err != nil || os.Geteuid() != 0 {
		testenv.Need(t, "runsc and root (scripts/install-runsc.sh)", os.ErrNotExist)
	}
	rep, err := benchMemory(t.Context(), t.TempDir(), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("cell %d KiB PSS (%d KiB RSS), bare %d KiB (×%.3f), %d KiB a cell in a pool of %d (×%.3f)",
		rep.CellKiB, rep.CellRSSKiB, rep.BareKiB, rep.Ratio, rep.PoolCellKiB, rep.PoolCells, rep.PoolRatio)
	switch {
	case rep.CellKiB <= 0 || rep.CellRSSKiB <= 0 || rep.BareKiB <= 0 || rep.PoolCellKiB <= 0:
		t.Fatalf("a figure was not measured: %+v", rep)
	case rep.PoolCells != 3:
		t.Fatalf("a pool of %d cells measured, want the quick run's 3", rep.PoolCells)
	case rep.CellKiB > rep.CellRSSKiB:
		t.Fatalf("a cell's PSS (%d KiB) exceeds its RSS (%d KiB): the fields of smaps_rollup are misread", rep.CellKiB, rep.CellRSSKiB)
	case !(rep.Ratio > 0) || !(rep.PoolRatio > 0):
		t.Fatalf("ratios not computed: ×%v against bare, ×%v in a pool", rep.Ratio, rep.PoolRatio)
	}
}
