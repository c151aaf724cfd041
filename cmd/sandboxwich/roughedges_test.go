package main

import (
	"context"
	"strings"
	"testing"
)

// TestMigrateHelpListsOnlyItsFlags: migrate -h shows the flags migrate
// reads (--config, --database-url), none of serve's.
func TestMigrateHelpListsOnlyItsFlags(t *testing.T) {
	te := newCLITestEnv("")
	if code := run(context.Background(), te.env(), []string{"migrate", "-h"}); code != 0 {
		t.Fatalf("migrate -h: exit %d\n%s", code, te.stderr)
	}
	help := te.stderr.String()
	for _, want := range []string{"-config", "-database-url"} {
		if !strings.Contains(help, want) {
			t.Errorf("migrate -h lacks %s:\n%s", want, help)
		}
	}
	for _, serveOnly := range []string{"-listen", "-log-level", "-max-lease-seconds", "-tls-cert-file", "-shutdown-timeout-ms"} {
		if strings.Contains(help, serveOnly) {
			t.Errorf("migrate -h lists serve's %s:\n%s", serveOnly, help)
		}
	}
	if code := run(context.Background(), te.env(), []string{"migrate", "--listen", ":1"}); code != 2 {
		t.Errorf("migrate --listen: exit %d, want 2 (a usage error)", code)
	}
	te2 := newCLITestEnv("")
	if code := run(context.Background(), te2.env(), []string{"serve", "-h"}); code != 0 || !strings.Contains(te2.stderr.String(), "-listen") {
		t.Errorf("serve -h: exit %d, lacks -listen:\n%s", code, te2.stderr)
	}
}

// TestCLILaunchWaitShowsOutput: launch --wait copies the workload's stdout
// and stderr to its own before the terminal status, and exits with the
// workload's status; with --json only the wire object is printed.
func TestCLILaunchWaitShowsOutput(t *testing.T) {
	s := startCellTestServer(t, 3)
	te := newCLITestEnv(s.url)
	id, att := s.lease(t)
	if code := te.run(proofArgs("launch", id, att, "--wait", "--poll", "5ms", "--", "echo", "from", "the", "workload")...); code != 0 {
		t.Fatalf("launch --wait: exit %d\n%s%s", code, te.stdout, te.stderr)
	}
	if out := te.stdout.String(); !strings.HasPrefix(out, "from the workload\n") || !strings.Contains(out, "terminal") {
		t.Errorf("launch --wait stdout:\n%s", out)
	}
	id2, att2 := s.lease(t)
	if code := te.run(proofArgs("launch", id2, att2, "--wait", "--poll", "5ms", "--", "no-such-program")...); code != 127 {
		t.Fatalf("launch --wait of a missing program: exit %d, want 127\n%s%s", code, te.stdout, te.stderr)
	}
	if !strings.Contains(te.stderr.String(), "no-such-program: command not found") {
		t.Errorf("launch --wait stderr lacks the workload's:\n%s", te.stderr)
	}
	id3, att3 := s.lease(t)
	if code := te.run(proofArgs("launch", id3, att3, "--wait", "--json", "--poll", "5ms", "--", "echo", "hidden")...); code != 0 ||
		strings.Contains(te.stdout.String(), "hidden") || !strings.HasPrefix(te.stdout.String(), "{") {
		t.Errorf("launch --wait --json: exit %d\n%s", code, te.stdout)
	}
}
