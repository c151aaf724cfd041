package main

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	_ "modernc.org/sqlite" // reads the server's database after it died

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/internal/reliability"
	"github.com/sandboxwich/sandboxwich/internal/testimage"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// crashRig runs the real binary with a gVisor pool and kills it at will.
type crashRig struct {
	t                  *testing.T
	bin, dir, db, addr string
	stateDir           string
	rel                lease.Release
	target             int
	// env is added to the server's environment at each start (an image
	// class's keys).
	env []string
	cmd *exec.Cmd
	log bytes.Buffer
}

func (r *crashRig) start(target int) {
	r.t.Helper()
	r.target = target
	r.cmd = exec.Command(r.bin, "serve")
	r.cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"SANDBOXWICH_LISTEN=" + r.addr,
		"SANDBOXWICH_DATABASE_URL=sqlite://" + r.db,
		"SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE=" + filepath.Join(r.dir, "key"),
		"SANDBOXWICH_TENANT_TOKENS=acme=tenant-token",
		"SANDBOXWICH_OPERATOR_TOKEN=operator-token",
		"SANDBOXWICH_SWEEP_INTERVAL_MS=100",
		"SANDBOXWICH_STERILE_POOL_PROVIDER=gvisor",
		"SANDBOXWICH_STERILE_POOL_TENANT_ID=acme",
		"SANDBOXWICH_STERILE_POOL_RELEASE_SET_ID=" + r.rel.ReleaseSetID,
		"SANDBOXWICH_STERILE_POOL_RUNTIME_CLASS=" + string(r.rel.RuntimeClass),
		"SANDBOXWICH_STERILE_POOL_POLICY_DIGEST=" + r.rel.PolicyDigest,
		"SANDBOXWICH_STERILE_POOL_RELEASE_SIGNATURE=" + r.rel.Signature,
		"SANDBOXWICH_GVISOR_STATE_DIR=" + r.stateDir,
		"SANDBOXWICH_GVISOR_BUNDLE_DIR=" + filepath.Join(r.dir, "bundles"),
	}
	if r.env != nil {
		r.cmd.Env = append(r.cmd.Env, r.env...)
		r.cmd.Env = append(r.cmd.Env, fmt.Sprintf("SANDBOXWICH_STERILE_POOL_MAX_CELLS=%d", target))
	} else {
		r.cmd.Env = append(r.cmd.Env, fmt.Sprintf("SANDBOXWICH_STERILE_POOL_TARGET=%d", target))
	}
	r.cmd.Stdout, r.cmd.Stderr = &r.log, &r.log
	if err := r.cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get("http://" + r.addr + "/healthz"); err == nil {
			resp.Body.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("server did not start:\n%s", r.log.String())
}

func (r *crashRig) kill() {
	_ = r.cmd.Process.Signal(syscall.SIGKILL)
	_ = r.cmd.Wait()
}

// members reads the pool's member counts.
func (r *crashRig) members() map[string]int {
	c, _ := client.New("http://"+r.addr, client.WithToken("tenant-token"), client.WithOperatorToken("operator-token"))
	pools, err := c.Pools(context.Background())
	if err != nil || len(pools) != 1 {
		return nil
	}
	return pools[0].Members
}

func live(m map[string]int) int {
	return m["provisioning"] + m["ready"] + m["leased"] + m["stopping"] + m["cleanup_pending"]
}

// waitFor polls the pool until cond holds, checking capacity on the way.
func (r *crashRig) waitFor(what string, cond func(map[string]int) bool) {
	r.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	prev := -1
	for time.Now().Before(deadline) {
		m := r.members()
		// Above the target (after the target was lowered) the pool may only
		// shrink; it never creates beyond it.
		if m != nil && live(m) > r.target && prev >= 0 && live(m) > prev {
			r.t.Fatalf("capacity grew above target %d: %v", r.target, m)
		}
		if m != nil {
			prev = live(m)
		}
		if m != nil && cond(m) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("pool never reached %s; last %v\n%s", what, r.members(), r.log.String())
}

// containers lists the runsc containers under the pool's private root.
func (r *crashRig) containers() []string {
	out, err := exec.Command("runsc", "--root", r.stateDir, "list", "-quiet").Output()
	if err != nil {
		return nil
	}
	ids := strings.Fields(string(out))
	sort.Strings(ids)
	return ids
}

// TestCrashRecoveryGVisor kills the server with SIGKILL while cells are
// provisioning and while they are stopping, restarts it, and checks that no
// runsc container leaks, none is reused, every member ends terminal or
// live, and capacity never exceeds the target.
func TestCrashRecoveryGVisor(t *testing.T) {
	r := newCrashRig(t)
	addr, rel := r.addr, r.rel

	// 1. Kill while provisioning, twice.
	for range 2 {
		r.start(2)
		r.waitFor("a provisioning member", func(m map[string]int) bool { return m["provisioning"] > 0 })
		r.kill()
	}
	r.start(2)
	r.waitFor("two ready cells", func(m map[string]int) bool { return m["ready"] == 2 && m["provisioning"] == 0 })

	// 2. A tenant claims and releases a cell; kill while it stops.
	c, _ := client.New("http://"+addr, client.WithToken("tenant-token"))
	b := lease.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "s"}
	cl, err := c.Claim(context.Background(), wire.ClaimRequest{Release: rel, Binding: b})
	if err != nil || cl.Lease == nil {
		t.Fatalf("claim: %v", err)
	}
	if _, err := c.Release(context.Background(), cl.Lease.LeaseID, cl.Proof(), lease.Destroyed); err != nil {
		t.Fatal(err)
	}
	r.waitFor("a stopping member", func(m map[string]int) bool { return m["stopping"] > 0 || m["destroyed"] > 0 })
	r.kill()

	// 3. Restart: the stop resumes under its recorded fence.
	r.start(2)
	st, err := c.WaitProviderAbsent(ctxTimeout(t, 90*time.Second), cl.Lease.LeaseID, 50*time.Millisecond)
	if err != nil || st.State != lease.Destroyed || !st.ProviderAbsent {
		t.Fatalf("released cell after restart: %+v %v\n%s", st, err, r.log.String())
	}
	r.waitFor("the pool refilled", func(m map[string]int) bool { return m["ready"] == 2 && live(m) == 2 })
	r.kill()
	r.checkInvariants(true)

	// 4. Drain: target 0 stops every cell with proof; no container remains.
	r.start(0)
	r.waitFor("an empty pool", func(m map[string]int) bool { return live(m) == 0 })
	r.kill()
	r.checkInvariants(true)
	if ids := r.containers(); len(ids) != 0 {
		t.Fatalf("containers leaked after drain: %v", ids)
	}
}

// newCrashRig builds the binary and the agent, a signing key and a
// release, and cleans every container up when the test ends.
func newCrashRig(t *testing.T) *crashRig {
	if _, err := exec.LookPath("runsc"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("runsc is not installed under CI=true (scripts/install-runsc.sh)")
		}
		t.Skip("runsc is not installed")
	}
	if testing.Short() {
		t.Skip("starts real gVisor sandboxes")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "sandboxwich")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	// The cell agent next to the binary, as a release installs them (the
	// server runs without HOME, so it could not build one).
	agentBuild := exec.Command("go", "build", "-trimpath", "-o", filepath.Join(dir, "sandboxwich-agent"), "../sandboxwich-agent")
	agentBuild.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := agentBuild.CombinedOutput(); err != nil {
		t.Fatalf("build the agent: %v\n%s", err, out)
	}
	if err := attest.GenerateKeyFile(filepath.Join(dir, "key")); err != nil {
		t.Fatal(err)
	}
	keys, err := attest.LoadKeyFile(filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	rel := lease.Release{ReleaseSetID: "crash", RuntimeClass: lease.GVisorLowerRisk, PolicyDigest: strings.Repeat("c", 64)}
	rel.Signature = keys.SignRelease(rel)
	r := &crashRig{t: t, bin: bin, dir: dir, db: filepath.Join(dir, "crash.db"), addr: addr,
		stateDir: filepath.Join(dir, "runsc"), rel: rel}
	t.Cleanup(func() {
		if r.cmd != nil && r.cmd.ProcessState == nil {
			r.kill()
		}
		for _, id := range r.containers() { // never leave a sandbox behind, even on failure
			_ = exec.Command("runsc", "--root", r.stateDir, "delete", "--force", id).Run()
		}
		if err := gvisor.RemoveStateDir(r.stateDir); err != nil {
			t.Errorf("removing runsc's state root: %v", err)
		}
	})

	return r
}

// checkInvariants reads the dead server's database: containers equal the
// non-terminal members, no cell was leased twice, no lease ID repeats, and
// every proven member's cell is terminal.
func (r *crashRig) checkInvariants(quiet bool) {
	r.t.Helper()
	db, err := sql.Open("sqlite", "file:"+r.db+"?mode=ro")
	if err != nil {
		r.t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT m.cell_id, m.state, m.provider_absent, COALESCE(c.state, '') FROM pool_members m
		LEFT JOIN cells c ON c.id = m.cell_id`)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rows.Close()
	var installation string
	if err := db.QueryRow(`SELECT id FROM installation`).Scan(&installation); err != nil {
		r.t.Fatal(err)
	}
	prefix := "sbw-" + driver.InstallationTag(installation) + "-" // the container IDs of this plane's cells
	var liveIDs []string
	for rows.Next() {
		var id, state, cellState string
		var absent bool
		if err := rows.Scan(&id, &state, &absent, &cellState); err != nil {
			r.t.Fatal(err)
		}
		ms := lease.MemberState(state)
		if !ms.Valid() {
			r.t.Fatalf("member %s in unknown state %q", id, state)
		}
		if ms.Live() {
			liveIDs = append(liveIDs, prefix+id)
		}
		if absent && !lease.State(cellState).Terminal() && cellState != "" {
			r.t.Fatalf("member %s proven absent but its cell is %s", id, cellState)
		}
	}
	var dup int
	if err := db.QueryRow(`SELECT count(*) FROM (SELECT lease_id FROM cells WHERE lease_id IS NOT NULL
		GROUP BY lease_id HAVING count(*) > 1)`).Scan(&dup); err != nil || dup != 0 {
		r.t.Fatalf("lease IDs on two cells: %d %v", dup, err)
	}
	sort.Strings(liveIDs)
	if got := r.containers(); quiet && strings.Join(got, ",") != strings.Join(liveIDs, ",") {
		r.t.Fatalf("runsc containers %v != live members %v", got, liveIDs)
	}
	// The event log, replayed, reproduces every cell and member: a kill
	// between a change and its event is impossible (one transaction).
	rdb, err := reliability.OpenDB("sqlite://" + r.db)
	if err != nil {
		r.t.Fatal(err)
	}
	defer rdb.Close()
	snap, err := rdb.Snapshot(context.Background())
	if err != nil {
		r.t.Fatal(err)
	}
	if v := snap.ReplayViolations(); len(v) > 0 || len(snap.Events) == 0 {
		r.t.Fatalf("event log after kills (%d events): %v", len(snap.Events), v)
	}
}

func ctxTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestCrashRecoveryImageClassGVisor kills the server with SIGKILL while it
// provisions a cell on demand for a fenced claim waiting for an image:
// after a restart the claim's retry (same claim_id and body) gets a cell
// of the image, its next retry the same lease, no container leaks and
// every member ends terminal or live.
func TestCrashRecoveryImageClassGVisor(t *testing.T) {
	r := newCrashRig(t)
	reg, err := testimage.Serve()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = reg.Close() })
	bb, err := testimage.Busybox("/bin/busybox")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("a static busybox is required under CI=true: %v", err)
		}
		t.Skip("no static busybox")
	}
	img, err := testimage.Image(bb)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := reg.Push("swe/task-1", img)
	if err != nil {
		t.Fatal(err)
	}
	r.env = []string{"SANDBOXWICH_STERILE_POOL_IMAGES=" + reg.Host + "/swe/*",
		"SANDBOXWICH_GVISOR_IMAGE_CACHE_DIR=" + filepath.Join(r.dir, "images")}
	c, _ := client.New("http://"+r.addr, client.WithToken("tenant-token"), client.WithRetry(1, time.Millisecond, time.Millisecond))
	wait := uint64(120)
	claimID := uuid.Must(uuid.NewV7())
	req := wire.ClaimRequest{ClaimID: &claimID, Release: r.rel, Image: &ref, WaitSeconds: &wait,
		Binding: lease.Binding{OrganizationID: "o", WorkspaceID: "w", ThreadID: "t", RunnerSessionID: "s"}}

	r.start(2)
	go func() { _, _ = c.Claim(context.Background(), req) }() // answered by no one: the server dies
	r.waitFor("a cell provisioning for the claim", func(m map[string]int) bool { return m["provisioning"] > 0 })
	r.kill()

	r.start(2)
	first, err := c.Claim(ctxTimeout(t, 3*time.Minute), req)
	if err != nil || first.Lease == nil {
		t.Fatalf("the claim's retry after the restart: %v %v\n%s", first, err, r.log.String())
	}
	again, err := c.Claim(ctxTimeout(t, time.Minute), req)
	if err != nil || again.Lease == nil || again.Lease.LeaseID != first.Lease.LeaseID {
		t.Fatalf("the next retry: %v %v, want lease %s", again, err, first.Lease.LeaseID)
	}
	if _, err := c.Release(context.Background(), first.Lease.LeaseID, first.Proof(), lease.Destroyed); err != nil {
		t.Fatal(err)
	}
	st, err := c.WaitProviderAbsent(ctxTimeout(t, 90*time.Second), first.Lease.LeaseID, 50*time.Millisecond)
	if err != nil || !st.ProviderAbsent {
		t.Fatalf("the released cell: %+v %v", st, err)
	}
	// The image is warm: a cell of it is made for its next claim.
	r.waitFor("a quiet pool", func(m map[string]int) bool {
		return m["ready"] == 1 && m["provisioning"] == 0 && m["stopping"] == 0 && m["cleanup_pending"] == 0
	})
	r.kill()
	r.checkInvariants(true)

	// Drain: the same pool as a fixed pool of target 0 stops what is left.
	r.env = nil
	r.start(0)
	r.waitFor("an empty pool", func(m map[string]int) bool { return live(m) == 0 })
	r.kill()
	r.checkInvariants(true)
	if ids := r.containers(); len(ids) != 0 {
		t.Fatalf("containers leaked: %v", ids)
	}
}
