package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/sandboxwich/sandboxwich/internal/bench"
)

// runBench prints the table, the JSON report and, as its last line, the
// ratios. With --fail-factor F it fails when a ratio is worse than F times
// its target (a gross regression, never noise).
func runBench(ctx context.Context, e env, args []string) error {
	fs := newFlags(e, "bench")
	quick := fs.Bool("quick", false, "fewer samples: under two minutes")
	pg := fs.String("postgres-url", e.getenv("SANDBOXWICH_TEST_POSTGRES_URL"), "PostgreSQL server to measure (env SANDBOXWICH_TEST_POSTGRES_URL); empty skips it")
	gv := fs.Bool("gvisor", true, "measure gVisor figures when runsc is installed")
	failFactor := fs.Float64("fail-factor", 0, "exit non-zero when a ratio is worse than this multiple of its target, or than its gate (0: never)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	rep, err := bench.Run(ctx, bench.Options{Quick: *quick, PostgresURL: *pg, GVisor: *gv, Logger: log})
	if err != nil {
		return err
	}
	rep.WriteTable(e.stdout)
	fmt.Fprintln(e.stdout)
	if err := rep.WriteJSON(e.stdout); err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, rep.SummaryLine())
	if *failFactor > 0 {
		if bad := rep.Regressions(*failFactor); len(bad) > 0 {
			return fmt.Errorf("gross regression (worse than ×%g the target, or the gate): %s", *failFactor, strings.Join(bad, ", "))
		}
	}
	return nil
}
