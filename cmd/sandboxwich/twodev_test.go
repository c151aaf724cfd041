package main

import (
	"context"
	"database/sql"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/wire"
)

// devServer is one `sandboxwich dev` run in this process, with its own
// --dir (database, key, tokens) and port, and the runsc state root it is
// given.
type devServer struct {
	t      *testing.T
	name   string
	dir    string
	url    string
	out    lockedBuffer
	cancel context.CancelFunc
	done   chan int
	c      *client.Client
}

func startDev(t *testing.T, name, stateRoot string) *devServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	s := &devServer{t: t, name: name, dir: filepath.Join(t.TempDir(), name), url: "http://" + addr, cancel: cancel, done: make(chan int, 1)}
	e := env{stdin: strings.NewReader(""), stdout: &s.out, stderr: &s.out, getenv: func(string) string { return "" }}
	go func() {
		s.done <- run(ctx, e, []string{"dev", "--dir", s.dir, "--listen", addr, "--state-dir", stateRoot})
	}()
	t.Cleanup(s.stop)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if resp, err := http.Get(s.url + "/healthz"); err == nil {
			resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev server %s did not start:\n%s", name, s.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	tok, err := os.ReadFile(filepath.Join(s.dir, "tenant-token"))
	if err != nil {
		t.Fatal(err)
	}
	op, err := os.ReadFile(filepath.Join(s.dir, "operator-token"))
	if err != nil {
		t.Fatal(err)
	}
	if s.c, err = client.New(s.url, client.WithToken(strings.TrimSpace(string(tok))),
		client.WithOperatorToken(strings.TrimSpace(string(op)))); err != nil {
		t.Fatal(err)
	}
	return s
}

// stop cancels the server's context (its drain runs) and waits for it.
func (s *devServer) stop() {
	s.cancel()
	select {
	case code := <-s.done:
		if code != 0 {
			s.t.Errorf("dev server %s exited %d:\n%s", s.name, code, s.out.String())
		}
		s.done <- code // stop is idempotent
	case <-time.After(2 * time.Minute):
		s.t.Errorf("dev server %s did not stop:\n%s", s.name, s.out.String())
	}
}

// waitReady waits until the pool has n ready cells.
func (s *devServer) waitReady(n int) {
	s.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		if pools, err := s.c.Pools(context.Background()); err == nil && len(pools) == 1 && pools[0].Members["ready"] >= n {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("dev server %s never had %d ready cells:\n%s", s.name, n, s.out.String())
}

// claim leases a cell of the dev pool.
func (s *devServer) claim() client.Claim {
	s.t.Helper()
	keys, err := attest.LoadKeyFile(filepath.Join(s.dir, "signing.key"))
	if err != nil {
		s.t.Fatal(err)
	}
	rel := devRelease(keys)
	cl, err := s.c.Claim(context.Background(), wire.ClaimRequest{
		Release: wire.Release(rel),
		Binding: wire.Binding{OrganizationID: "org-" + s.name, WorkspaceID: "ws", ThreadID: "th", RunnerSessionID: "s"},
	})
	if err != nil || cl.Empty() {
		s.t.Fatalf("claim in %s = %v, %v:\n%s", s.name, cl, err, s.out.String())
	}
	return cl
}

// exec runs `echo <name>` in the claimed cell and fails the test unless it
// worked.
func (s *devServer) exec(cl client.Claim, when string) {
	s.t.Helper()
	res, err := s.c.Run(context.Background(), cl.Lease.LeaseID, cl.Proof(), client.Command{Argv: []string{"echo", s.name}})
	if err != nil || res.ExitCode != 0 || string(res.Stdout) != s.name+"\n" {
		s.t.Fatalf("%s: exec in %s's cell %s = exit %d, stdout %q, stderr %q, %v", when, s.name, cl.Lease.CellID,
			res.ExitCode, res.Stdout, res.Stderr, err)
	}
}

// liveCells reads the cells the server's store holds as ready or leased.
func (s *devServer) liveCells() []uuid.UUID {
	s.t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(s.dir, "sandboxwich.db")+"?mode=ro")
	if err != nil {
		s.t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT id FROM cells WHERE state IN ('ready', 'leased')`)
	if err != nil {
		s.t.Fatal(err)
	}
	defer rows.Close()
	var ids []uuid.UUID
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			s.t.Fatal(err)
		}
		ids = append(ids, uuid.MustParse(id))
	}
	return ids
}

// hostContainers lists the runsc containers under a state root.
func hostContainers(t *testing.T, root string) []string {
	t.Helper()
	out, err := exec.Command(gvisor.FindRunsc(), "--root", root, "list", "-quiet").Output()
	if err != nil {
		t.Fatalf("runsc list: %v", err)
	}
	return strings.Fields(string(out))
}

// containerOf returns the container of cell among ids, or "".
func containerOf(ids []string, cell uuid.UUID) string {
	i := slices.IndexFunc(ids, func(id string) bool { return strings.HasSuffix(id, "-"+cell.String()) })
	if i < 0 {
		return ""
	}
	return ids[i]
}

// TestTwoDevServersOnOneHost runs two `dev` servers side by side, each with
// its own --dir and database but the same pool name and one runsc state
// root (as every process of a user shared the default root before dev kept
// its own under --dir). Each claims a cell and
// execs in it; after both have run orphan passes over the other's cells,
// both cells still exec. Stopping A (its drain) leaves B's cells running.
func TestTwoDevServersOnOneHost(t *testing.T) {
	if gvisor.FindRunsc() == "" || os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("runsc (scripts/install-runsc.sh) and root are required under CI=true")
		}
		t.Skip("needs runsc and root")
	}
	if testing.Short() {
		t.Skip("starts real gVisor sandboxes")
	}
	root, err := os.MkdirTemp("", "sbw-twodev-")
	if err != nil {
		t.Fatal(err)
	}
	var leased []uuid.UUID // whatever the drains leave of them is removed at the end
	t.Cleanup(func() {
		ids := hostContainers(t, root)
		for _, cell := range leased {
			if id := containerOf(ids, cell); id != "" {
				_ = exec.Command(gvisor.FindRunsc(), "--root", root, "delete", "--force", id).Run()
			}
		}
		if err := gvisor.RemoveStateDir(root); err != nil {
			t.Errorf("removing the state root: %v", err)
		}
	})

	a := startDev(t, "a", root)
	a.waitReady(2)
	claimA := a.claim()
	leased = append(leased, claimA.Lease.CellID)
	a.exec(claimA, "A before B started")

	b := startDev(t, "b", root)
	b.waitReady(2)
	claimB := b.claim()
	leased = append(leased, claimB.Lease.CellID)
	b.exec(claimB, "B after it started")
	a.exec(claimA, "A after B's first reconcile passes")

	// The orphan search runs at a server's first pass and every 30 s
	// after; wait until A's second one ran with B's cells present.
	time.Sleep(35 * time.Second)
	a.exec(claimA, "A after several reconcile passes of both")
	b.exec(claimB, "B after several reconcile passes of both")

	cellsA, cellsB := a.liveCells(), b.liveCells()
	before := hostContainers(t, root)
	for _, cell := range cellsB {
		if containerOf(before, cell) == "" {
			t.Fatalf("B's live cell %s has no container before A stopped; containers %q", cell, before)
		}
	}
	a.stop()
	b.exec(claimB, "B after A's drain")
	after := hostContainers(t, root)
	for _, cell := range cellsB {
		if containerOf(after, cell) == "" {
			t.Errorf("A's drain destroyed B's cell %s; containers %q", cell, after)
		}
	}
	for _, cell := range cellsA {
		if id := containerOf(after, cell); id != "" && cell != claimA.Lease.CellID {
			t.Errorf("A's ready cell %s still has container %s after A's drain", cell, id)
		}
	}
	b.stop()
	final := hostContainers(t, root)
	for _, cell := range cellsB {
		if id := containerOf(final, cell); id != "" && cell != claimB.Lease.CellID {
			t.Errorf("B's ready cell %s still has container %s after B's drain", cell, id)
		}
	}
}
