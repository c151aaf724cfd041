package main

import (
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/wire"
)

func TestCLIEvents(t *testing.T) {
	s := startCLITestServer(t)
	te := newCLITestEnv(s.url)
	s.prepareCell(t)
	id, _ := s.claimLease(t, te, "s-1")
	s.prepareCell(t)

	if code := te.run("events", "--json", "--limit", "1"); code != 0 {
		t.Fatalf("events --json: exit %d\n%s", code, te.stderr)
	}
	r := decodeStdout[wire.EventsResponse](t, te)
	var types []string
	for _, ev := range r.Events {
		types = append(types, ev.Type)
	}
	if got := strings.Join(types, " "); got != "cell.ready cell.leased cell.ready" || r.NextAfter != r.Events[2].ID {
		t.Fatalf("events --json: %s (next_after %s)", got, r.NextAfter)
	}
	if code := te.run("events", "--lease-id", id.String()); code != 0 {
		t.Fatalf("events --lease-id: exit %d\n%s", code, te.stderr)
	}
	lines := strings.Split(strings.TrimSpace(te.stdout.String()), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[1], "cell.leased") ||
		!strings.Contains(lines[1], "claimed") || !strings.Contains(te.stderr.String(), "--after ") {
		t.Fatalf("events --lease-id:\n%s%s", te.stdout, te.stderr)
	}

	// Follow from the start: the three events, one JSON object a line.
	if code := te.run("events", "--follow", "--after", "0", "--count", "3", "--json"); code != 0 {
		t.Fatalf("events --follow: exit %d\n%s", code, te.stderr)
	}
	if got := strings.Count(te.stdout.String(), "\n"); got != 3 || !strings.Contains(te.stdout.String(), `"type":"cell.leased"`) {
		t.Fatalf("events --follow --count 3:\n%s", te.stdout)
	}
	// Follow until the timeout: what exists, then exit 0.
	if code := te.run("events", "--follow", "--after", r.Events[1].ID, "--timeout", "500ms"); code != 0 ||
		strings.Count(te.stdout.String(), "\n") != 1 {
		t.Fatalf("events --follow --timeout: exit %d\n%s%s", code, te.stdout, te.stderr)
	}
	if code := te.run("events", "--after", "x"); code == 0 || !strings.Contains(te.stderr.String(), "invalid_request") {
		t.Errorf("events --after x: exit %d\n%s", code, te.stderr)
	}
}
