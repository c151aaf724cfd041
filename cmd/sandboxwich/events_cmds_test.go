package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"

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

// TestCLIEventsFollowServerGone: a follow whose server goes away says so on
// stderr once, keeps reconnecting, and exits 1 after --give-up-after
// instead of retrying silently forever; a server that answers again is
// reported back.
func TestCLIEventsFollowServerGone(t *testing.T) {
	ev, err := json.Marshal(wire.Event{ID: "1", Type: "cell.ready", CellID: uuid.New()})
	if err != nil {
		t.Fatal(err)
	}
	var down atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		if r.Header.Get(wire.LastEventIDHeader) == "0" {
			fmt.Fprintf(w, "id: 1\nevent: cell.ready\ndata: %s\n\n", ev)
		}
	}))
	defer srv.Close()
	stdout, stderr := &lockedBuffer{}, &lockedBuffer{}
	e := env{stdout: stdout, stderr: stderr, getenv: func(k string) string {
		return map[string]string{"SANDBOXWICH_URL": srv.URL, "SANDBOXWICH_TOKEN": cliTestTenantToken}[k]
	}}
	done := make(chan int, 1)
	go func() {
		done <- run(context.Background(), e, []string{"events", "--follow", "--after", "0", "--give-up-after", "1s"})
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no %s:\nstdout:\n%s\nstderr:\n%s", what, stdout.String(), stderr.String())
			}
		}
	}
	waitFor("event", func() bool { return strings.Contains(stdout.String(), "cell.ready") })

	// Unavailable for a moment, then back: reported both ways, no exit.
	down.Store(true)
	waitFor("report of the failure", func() bool { return strings.Contains(stderr.String(), "does not answer") })
	down.Store(false)
	waitFor("report of the reconnection", func() bool { return strings.Contains(stderr.String(), "reconnected to "+srv.URL) })

	// Gone: reported once more, then exit 1 after the bound.
	srv.CloseClientConnections()
	srv.Close()
	select {
	case code := <-done:
		msg := stderr.String()
		if code != 1 || strings.Count(msg, "does not answer") != 2 || !strings.Contains(msg, "giving up after 1s") ||
			!strings.Contains(msg, "sandboxwich events: the server stayed unreachable for 1s; giving up") {
			t.Fatalf("events --follow of a gone server: exit %d\n%s", code, msg)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("events --follow did not give up:\n%s", stderr.String())
	}
}
