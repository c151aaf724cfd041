// Package drivertest is the conformance suite every driver.Provider must
// pass. A driver's tests call Run with a Harness that makes providers:
//
//	func TestConformance(t *testing.T) {
//		drivertest.Run(t, myHarness{})
//	}
//
// The suite provisions real objects through the harness's providers and
// destroys every one of them in t.Cleanup. Its subtests run in parallel, so
// the providers must be safe for concurrent use, as driver.Provider requires;
// Run returns only after every subtest has finished, so a caller may check
// for leftovers afterwards.
//
// What is checked:
//   - Capabilities: mode apply or dry_run, the harness's class listed, a
//     non-empty kind and identity.
//   - Provision then Inspect: the object exists under the same identity,
//     with the harness's runtime class, and driver.Verify accepts it.
//   - Provision is idempotent per cell ID: the same identity, one object.
//   - Destroy proves absence; destroying an absent object, or the same object
//     twice, returns nil.
//   - List after a simulated crash: a provider made afterwards lists the
//     object made by an earlier one and can destroy it.
//   - Exec (when the provider is a driver.Execer, or else through the
//     cell agent of a driver.AgentHost, activated once per cell): stdin,
//     env, non-zero exit codes, timeouts (TimedOut, bounded time, nothing
//     left running), output caps (Truncated), and driver.ErrNotFound after
//     Destroy.
//   - Exec isolation: a file written or a process started in one cell is
//     invisible in another.
//   - Cancellation: Provision and Exec with an already-cancelled or a
//     short-deadline context return promptly and leak nothing.
//   - The cell agent (when the provider is a driver.AgentHost, CONTRACT
//     §13): a fresh cell's agent is waiting, with 0 activations, its own
//     cell ID and the digest Inspect reports (non-empty); nothing runs
//     before activation (agent.ErrNotActive); an activation and its exact
//     replay are accepted, a second fence refused; exec (output collected
//     and streamed, exit codes, cwd, user root and cell), files written and
//     read back byte-exact (owner, mode, missing, too large, denied), one
//     launch with its replay, conflict, status and output file; release
//     ends the agent for its fence only; expiry
//     ends the agent, which then refuses everything (and, for a harness
//     that is a ProcessCounter, has killed a background process); after
//     Destroy the agent is unreachable (driver.ErrNotFound).
//   - Images (CONTRACT §21): a provider that reports Capabilities.Images
//     makes a cell of each image its ImageHarness gives, which admits
//     that image's digest and serves its marker file; a reference not
//     pinned by digest is refused and leaves nothing. One that does not
//     report Images refuses a request that names an image.
//
// The Exec subtests run small POSIX shell commands in the cell (sh, cat,
// printf, sleep, shell globs over /proc), so a provider's cells must have a
// POSIX shell and those utilities to pass them.
package drivertest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Harness makes providers for the suite.
type Harness interface {
	// MakeProvider returns a fresh provider. It has "restart" semantics:
	// calling it again must return a provider that sees the objects created
	// by earlier ones (the same backing state), so the suite can test List
	// after a simulated crash.
	MakeProvider(ctx context.Context, t *testing.T) (driver.Provider, error)
	// RuntimeClass is the class the provider serves in this harness.
	RuntimeClass() lease.RuntimeClass
}

// Time limits the suite holds providers to. They are generous on purpose:
// the suite must pass on a loaded two-core CI machine.
const (
	// callTimeout bounds one provider call that is not under test for speed.
	callTimeout = 2 * time.Minute
	// prompt is how long a cancelled or expired call may take to return,
	// cleanup included.
	prompt = 15 * time.Second
	// execTimeout is the command timeout used by the timeout subtest.
	execTimeout = time.Second
	// killGuard is how long a killed command's process may stay visible in
	// the cell. It is a hang guard, not a speed figure: a real-node cell
	// under a 50m CPU quota on a loaded CI machine once took 78 s to report
	// a kill at its 1 s timeout (bounds of 15 s, then 60 s, both failed).
	killGuard = 5 * time.Minute
)

// Run runs the conformance suite against the providers h makes.
func Run(t *testing.T, h Harness) {
	t.Helper()
	s := &suite{h: h, class: h.RuntimeClass()}
	t.Run("Conformance", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			fn   func(*testing.T)
		}{
			{"Capabilities", s.testCapabilities},
			{"ProvisionInspect", s.testProvisionInspect},
			{"ProvisionIdempotent", s.testProvisionIdempotent},
			{"Destroy", s.testDestroy},
			{"DestroyAbsent", s.testDestroyAbsent},
			{"DestroyTwice", s.testDestroyTwice},
			{"ListAfterRestart", s.testListAfterRestart},
			{"Exec", s.testExec},
			{"ExecIsolation", s.testExecIsolation},
			{"Cancellation", s.testCancellation},
			{"Agent", s.testAgent},
			{"Images", s.testImages},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				tc.fn(t)
			})
		}
	})
}

type suite struct {
	h     Harness
	class lease.RuntimeClass
}

// provider makes a provider through the harness, failing the test if it
// cannot.
func (s *suite) provider(t *testing.T) driver.Provider {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	p, err := s.h.MakeProvider(ctx, t)
	if err != nil {
		t.Fatalf("MakeProvider: %v", err)
	}
	if p == nil {
		t.Fatal("MakeProvider returned a nil provider")
	}
	return p
}

// ctx returns a context bounded by callTimeout and cancelled at cleanup.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), callTimeout)
	t.Cleanup(cancel)
	return c
}

// cleanupDestroy registers a Destroy of the cell's object that must succeed.
// The object is named by its cell ID alone (an empty identity), so the
// cleanup also removes objects whose provisioning failed or was cancelled.
func cleanupDestroy(t *testing.T, p driver.Provider, cellID uuid.UUID) {
	t.Helper()
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), callTimeout)
		defer cancel()
		obj := driver.Object{CellID: cellID}
		if err := p.Destroy(c, obj); err != nil {
			t.Errorf("cleanup: Destroy(%s): %v", cellID, err)
			return
		}
		if o, err := p.Inspect(c, obj); err != nil {
			t.Errorf("cleanup: Inspect(%s) after Destroy: %v", cellID, err)
		} else if o.Exists {
			t.Errorf("cleanup: object of cell %s still exists after Destroy: %s", cellID, o.Detail)
		}
	})
}

// provision provisions a new cell and registers its destruction.
func (s *suite) provision(t *testing.T, p driver.Provider) driver.Object {
	t.Helper()
	cellID := uuid.Must(uuid.NewV7())
	cleanupDestroy(t, p, cellID)
	obj, err := p.Provision(ctx(t), driver.ProvisionRequest{CellID: cellID, RuntimeClass: s.class})
	if err != nil {
		t.Fatalf("Provision(%s): %v", cellID, err)
	}
	if obj.CellID != cellID {
		t.Fatalf("Provision returned cell ID %s, want %s", obj.CellID, cellID)
	}
	if obj.Identity == "" {
		t.Fatalf("Provision(%s) returned an empty identity", cellID)
	}
	return obj
}

// requireAbsent fails unless Inspect reports no object for the cell.
func requireAbsent(t *testing.T, p driver.Provider, obj driver.Object) {
	t.Helper()
	o, err := p.Inspect(ctx(t), obj)
	if err != nil {
		t.Fatalf("Inspect(%s): %v", obj.CellID, err)
	}
	if o.Exists {
		t.Fatalf("Inspect(%s) after Destroy: object exists (%s)", obj.CellID, o.Detail)
	}
}

// listCount counts the objects of cellID that List returns; it skips the
// test when p is not a driver.Lister.
func listCount(t *testing.T, p driver.Provider, cellID uuid.UUID) (int, []driver.Object) {
	t.Helper()
	l, ok := p.(driver.Lister)
	if !ok {
		t.Skip("provider is not a driver.Lister")
	}
	objs, err := l.List(ctx(t))
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	n := 0
	var mine []driver.Object
	for _, o := range objs {
		if o.CellID == cellID {
			n++
			mine = append(mine, o)
		}
	}
	return n, mine
}

func (s *suite) testCapabilities(t *testing.T) {
	c := s.provider(t).Capabilities()
	if c.Mode != driver.Apply && c.Mode != driver.DryRun {
		t.Errorf("Mode = %q, want %q or %q", c.Mode, driver.Apply, driver.DryRun)
	}
	if c.Kind == "" {
		t.Error("Kind is empty")
	}
	if c.Identity == "" {
		t.Error("Identity is empty")
	}
	if !slices.Contains(c.RuntimeClasses, s.class) {
		t.Errorf("RuntimeClasses = %v, want it to list the harness's class %q", c.RuntimeClasses, s.class)
	}
	for _, rc := range c.RuntimeClasses {
		if !rc.Valid() {
			t.Errorf("RuntimeClasses lists an undefined class %q", rc)
		}
	}
}

func (s *suite) testProvisionInspect(t *testing.T) {
	p := s.provider(t)
	obj := s.provision(t, p)
	o, err := p.Inspect(ctx(t), obj)
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if !o.Exists {
		t.Fatalf("Inspect after Provision: Exists = false (%s)", o.Detail)
	}
	if o.Identity != obj.Identity {
		t.Errorf("Inspect identity = %q, Provision returned %q", o.Identity, obj.Identity)
	}
	if o.RuntimeClass != s.class {
		t.Errorf("Inspect runtime class = %q, want %q (%s)", o.RuntimeClass, s.class, o.Detail)
	}
	if !o.Ready {
		t.Errorf("Inspect after Provision: Ready = false (%s)", o.Detail)
	}
	if err := driver.Verify(obj, o, s.class); err != nil {
		t.Errorf("driver.Verify: %v", err)
	}
}

func (s *suite) testProvisionIdempotent(t *testing.T) {
	p := s.provider(t)
	obj := s.provision(t, p)
	again, err := p.Provision(ctx(t), driver.ProvisionRequest{CellID: obj.CellID, RuntimeClass: s.class})
	if err != nil {
		t.Fatalf("second Provision: %v", err)
	}
	if again != obj {
		t.Errorf("second Provision = %+v, first = %+v", again, obj)
	}
	// A provider made afterwards (a retry after a crash) returns the same
	// object too.
	again, err = s.provider(t).Provision(ctx(t), driver.ProvisionRequest{CellID: obj.CellID, RuntimeClass: s.class})
	if err != nil {
		t.Fatalf("Provision through a new provider: %v", err)
	}
	if again != obj {
		t.Errorf("Provision through a new provider = %+v, first = %+v", again, obj)
	}
	if n, mine := listCount(t, p, obj.CellID); n != 1 {
		t.Errorf("List holds %d objects for the cell, want 1: %+v", n, mine)
	}
}

func (s *suite) testDestroy(t *testing.T) {
	p := s.provider(t)
	obj := s.provision(t, p)
	if err := p.Destroy(ctx(t), obj); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	requireAbsent(t, p, obj)
	if o, _ := p.Inspect(ctx(t), obj); driver.Verify(obj, o, s.class) == nil {
		t.Error("driver.Verify accepts a destroyed object")
	}
	if l, ok := p.(driver.Lister); ok {
		objs, err := l.List(ctx(t))
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for _, o := range objs {
			if o.CellID == obj.CellID {
				t.Errorf("List after Destroy still holds %+v", o)
			}
		}
	}
	if e, ok := p.(driver.Execer); ok {
		_, err := e.Exec(ctx(t), obj, driver.ExecRequest{Argv: []string{"true"}, Timeout: 30 * time.Second, MaxOutput: 1024})
		if !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("Exec after Destroy: err = %v, want driver.ErrNotFound", err)
		}
	}
	if h, ok := p.(driver.AgentHost); ok {
		if _, err := h.Agent(ctx(t), obj); !errors.Is(err, driver.ErrNotFound) {
			t.Errorf("Agent after Destroy: err = %v, want driver.ErrNotFound", err)
		}
	}
}

func (s *suite) testDestroyAbsent(t *testing.T) {
	p := s.provider(t)
	obj := driver.Object{CellID: uuid.Must(uuid.NewV7()), Identity: "never-created"}
	if err := p.Destroy(ctx(t), obj); err != nil {
		t.Fatalf("Destroy of a never-created object: %v", err)
	}
	if err := p.Destroy(ctx(t), driver.Object{CellID: obj.CellID}); err != nil {
		t.Fatalf("Destroy of a never-created object without identity: %v", err)
	}
	requireAbsent(t, p, obj)
}

func (s *suite) testDestroyTwice(t *testing.T) {
	p := s.provider(t)
	obj := s.provision(t, p)
	if err := p.Destroy(ctx(t), obj); err != nil {
		t.Fatalf("first Destroy: %v", err)
	}
	if err := p.Destroy(ctx(t), obj); err != nil {
		t.Fatalf("second Destroy: %v", err)
	}
	requireAbsent(t, p, obj)
}

func (s *suite) testListAfterRestart(t *testing.T) {
	a := s.provider(t)
	if _, ok := a.(driver.Lister); !ok {
		t.Skip("provider is not a driver.Lister")
	}
	obj := s.provision(t, a)
	// Provider a "crashes": a new provider over the same backing state must
	// find the object and be able to prove its destruction.
	b := s.provider(t)
	n, mine := listCount(t, b, obj.CellID)
	if n != 1 {
		t.Fatalf("List through a new provider holds %d objects for the cell, want 1: %+v", n, mine)
	}
	if mine[0].Identity != obj.Identity {
		t.Errorf("List identity = %q, Provision returned %q", mine[0].Identity, obj.Identity)
	}
	if err := b.Destroy(ctx(t), mine[0]); err != nil {
		t.Fatalf("Destroy through the new provider: %v", err)
	}
	requireAbsent(t, b, obj)
	requireAbsent(t, a, obj)
	if n, mine := listCount(t, b, obj.CellID); n != 0 {
		t.Errorf("List after Destroy holds %+v", mine)
	}
}

// NoShell is an optional interface of a Harness whose cells run no POSIX
// shell and no coreutils (an in-memory agent such as driver/fake's): the
// cases that run `sh -c`, `id` or `stat` through its agent are skipped; its
// status, activation, refusal, release and destroy cases still run.
type NoShell interface {
	// NoShell marks the harness.
	NoShell()
}

// execer returns p as a driver.Execer, or, for a driver.AgentHost that is
// not one, an Execer running commands through the cell's agent; otherwise
// (or for a NoShell harness's agent) it skips the test.
func (s *suite) execer(t *testing.T, p driver.Provider) driver.Execer {
	t.Helper()
	if e, ok := p.(driver.Execer); ok {
		return e
	}
	if h, ok := p.(driver.AgentHost); ok {
		s.needsShell(t)
		return &agentExecer{h: h, acts: make(map[driver.Object]agent.Activation)}
	}
	t.Skip("provider is neither a driver.Execer nor a driver.AgentHost")
	return nil
}

// run executes req in obj and fails the test on an error.
func run(t *testing.T, e driver.Execer, obj driver.Object, req driver.ExecRequest) driver.ExecResult {
	t.Helper()
	if req.Timeout == 0 {
		req.Timeout = time.Minute
	}
	if req.MaxOutput == 0 {
		req.MaxOutput = 1 << 20
	}
	res, err := e.Exec(ctx(t), obj, req)
	if err != nil {
		t.Fatalf("Exec(%q): %v", req.Argv, err)
	}
	return res
}

// sh is the argv of a shell script.
func sh(script string) []string { return []string{"sh", "-c", script} }

// processList returns the NUL-separated command lines of every process the
// cell can see in its /proc.
func processList(t *testing.T, e driver.Execer, obj driver.Object) []byte {
	t.Helper()
	res := run(t, e, obj, driver.ExecRequest{Argv: sh("cat /proc/[0-9]*/cmdline 2>/dev/null; true")})
	if res.ExitCode != 0 {
		t.Fatalf("listing processes: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	return res.Stdout
}

// sleepMarker is the command line /proc shows for `sleep <secs>`.
func sleepMarker(secs int) []byte { return []byte(fmt.Sprintf("sleep\x00%d\x00", secs)) }

func (s *suite) testExec(t *testing.T) {
	p := s.provider(t)
	e := s.execer(t, p)
	obj := s.provision(t, p)
	// The subtests share one cell and run one after another.
	t.Run("Stdin", func(t *testing.T) {
		in := []byte("hello from stdin\nsecond line\n")
		res := run(t, e, obj, driver.ExecRequest{Argv: []string{"cat"}, Stdin: in})
		if res.ExitCode != 0 || !bytes.Equal(res.Stdout, in) || len(res.Stderr) != 0 {
			t.Errorf("cat: exit %d, stdout %q, stderr %q; want 0, %q, empty", res.ExitCode, res.Stdout, res.Stderr, in)
		}
		if res.Truncated || res.TimedOut {
			t.Errorf("cat: Truncated %v, TimedOut %v; want false, false", res.Truncated, res.TimedOut)
		}
		if res.Duration <= 0 {
			t.Errorf("Duration = %v, want > 0", res.Duration)
		}
	})
	t.Run("Stderr", func(t *testing.T) {
		res := run(t, e, obj, driver.ExecRequest{Argv: sh("printf out; printf err >&2")})
		if string(res.Stdout) != "out" || string(res.Stderr) != "err" {
			t.Errorf("stdout %q, stderr %q; want \"out\", \"err\"", res.Stdout, res.Stderr)
		}
	})
	t.Run("Env", func(t *testing.T) {
		const value = "a value with spaces, = and 'quotes'"
		res := run(t, e, obj, driver.ExecRequest{
			Argv: sh(`printf '%s|%s' "$DRIVERTEST_ONE" "$DRIVERTEST_TWO"`),
			Env:  map[string]string{"DRIVERTEST_ONE": value, "DRIVERTEST_TWO": "2"},
		})
		if want := value + "|2"; res.ExitCode != 0 || string(res.Stdout) != want {
			t.Errorf("env: exit %d, stdout %q; want 0, %q (stderr %q)", res.ExitCode, res.Stdout, want, res.Stderr)
		}
		// Env does not persist into the next command.
		res = run(t, e, obj, driver.ExecRequest{Argv: sh(`printf '%s' "${DRIVERTEST_ONE-unset}"`)})
		if string(res.Stdout) != "unset" {
			t.Errorf("env leaked into a later command: %q", res.Stdout)
		}
	})
	t.Run("ExitCode", func(t *testing.T) {
		res := run(t, e, obj, driver.ExecRequest{Argv: sh("echo failing; exit 7")})
		if res.ExitCode != 7 || string(res.Stdout) != "failing\n" {
			t.Errorf("exit %d, stdout %q; want 7, \"failing\\n\"", res.ExitCode, res.Stdout)
		}
	})
	t.Run("Timeout", func(t *testing.T) {
		// The command sleeps 600 s or more: an Exec that returns before
		// then, timed out and without its last line, was killed at its
		// timeout. How soon after the timeout is the bench's business.
		secs := 600 + rand.IntN(300)
		natural := time.Duration(secs) * time.Second
		c, cancel := context.WithTimeout(context.Background(), natural)
		defer cancel()
		start := time.Now()
		res, err := e.Exec(c, obj, driver.ExecRequest{
			Argv:      sh(fmt.Sprintf("echo started; sleep %d; echo not reached", secs)),
			Timeout:   execTimeout,
			MaxOutput: 1024,
		})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("Exec with a timeout: %v (a timeout is a result, not an error)", err)
		}
		if !res.TimedOut {
			t.Errorf("TimedOut = false (exit %d, stdout %q, stderr %q)", res.ExitCode, res.Stdout, res.Stderr)
		}
		if res.ExitCode == 0 {
			t.Error("a timed-out command reports exit code 0")
		}
		if took < execTimeout || took >= natural {
			t.Errorf("Exec took %v, want at least its timeout %v and less than the command's own %v", took, execTimeout, natural)
		}
		if bytes.Contains(res.Stdout, []byte("not reached")) {
			t.Errorf("command ran past its timeout: %q", res.Stdout)
		}
		waitGone(t, e, obj, sleepMarker(secs))
	})
	t.Run("OutputCap", func(t *testing.T) {
		const max = 1000
		// About 80 KB on each stream, far over the cap: the driver must keep
		// draining so the command finishes normally.
		res := run(t, e, obj, driver.ExecRequest{
			Argv:      sh(`i=0; while [ $i -lt 2000 ]; do echo 0123456789012345678901234567890123456789; echo abcdefghijabcdefghijabcdefghijabcdefghij >&2; i=$((i+1)); done; exit 3`),
			MaxOutput: max,
		})
		if !res.Truncated {
			t.Error("Truncated = false")
		}
		if len(res.Stdout) != max || len(res.Stderr) != max {
			t.Errorf("len(stdout) = %d, len(stderr) = %d, want %d each", len(res.Stdout), len(res.Stderr), max)
		}
		if !bytes.HasPrefix(res.Stdout, []byte("0123456789")) {
			t.Errorf("stdout does not keep the first bytes: %.40q", res.Stdout)
		}
		if res.ExitCode != 3 || res.TimedOut {
			t.Errorf("exit %d, TimedOut %v; want 3, false", res.ExitCode, res.TimedOut)
		}
		res = run(t, e, obj, driver.ExecRequest{Argv: sh("printf 0123456789"), MaxOutput: 10})
		if res.Truncated || string(res.Stdout) != "0123456789" {
			t.Errorf("output exactly at the cap: Truncated %v, stdout %q", res.Truncated, res.Stdout)
		}
	})
	t.Run("Argv", func(t *testing.T) {
		arg := `one arg with "quotes", $dollars and ;semicolons`
		res := run(t, e, obj, driver.ExecRequest{Argv: []string{"printf", "%s", arg}})
		if string(res.Stdout) != arg {
			t.Errorf("argv passed as %q, want %q", res.Stdout, arg)
		}
	})
}

// waitGone fails unless no process with the given command line is visible
// in the cell within killGuard (a kill that is slow under load still ends
// the process; one that never does fails).
func waitGone(t *testing.T, e driver.Execer, obj driver.Object, marker []byte) {
	t.Helper()
	deadline := time.Now().Add(killGuard)
	for {
		procs := processList(t, e, obj)
		if !bytes.Contains(procs, marker) {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("process %q still runs in the cell after its exec ended", bytes.ReplaceAll(marker, []byte{0}, []byte{' '}))
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (s *suite) testExecIsolation(t *testing.T) {
	p := s.provider(t)
	e := s.execer(t, p)
	// Provision the two cells in parallel: it halves the wait.
	var objs [2]driver.Object
	var errs [2]error
	var wg sync.WaitGroup
	for i := range objs {
		cellID := uuid.Must(uuid.NewV7())
		cleanupDestroy(t, p, cellID)
		wg.Add(1)
		go func() {
			defer wg.Done()
			objs[i], errs[i] = p.Provision(ctx(t), driver.ProvisionRequest{CellID: cellID, RuntimeClass: s.class})
		}()
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		t.Fatalf("Provision: %v", err)
	}
	one, two := objs[0], objs[1]

	token := fmt.Sprintf("secret-%d", rand.Uint64())
	secs := 600 + rand.IntN(300)
	file := fmt.Sprintf("/tmp/drivertest-%d", rand.Uint64())
	res := run(t, e, one, driver.ExecRequest{
		// The background process holds none of the exec's streams open.
		Argv: sh(fmt.Sprintf("{ printf %%s %s > %s; exec sleep %d; } < /dev/null > /dev/null 2>&1 &", token, file, secs)),
	})
	if res.ExitCode != 0 {
		t.Fatalf("writing in cell one: exit %d, stderr %q", res.ExitCode, res.Stderr)
	}
	// Cell one sees its own file and process…
	deadline := time.Now().Add(10 * time.Second)
	for {
		res = run(t, e, one, driver.ExecRequest{Argv: []string{"cat", file}})
		if string(res.Stdout) == token && bytes.Contains(processList(t, e, one), sleepMarker(secs)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("cell one does not see its own file and process (cat: exit %d, %q)", res.ExitCode, res.Stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// …cell two sees neither.
	res = run(t, e, two, driver.ExecRequest{Argv: sh("cat " + file + " 2>&1; true")})
	if strings.Contains(string(res.Stdout), token) {
		t.Errorf("cell two reads cell one's file %s: %q", file, res.Stdout)
	}
	if procs := processList(t, e, two); bytes.Contains(procs, sleepMarker(secs)) {
		t.Errorf("cell two sees cell one's process `sleep %d` in /proc", secs)
	}
}

func (s *suite) testCancellation(t *testing.T) {
	t.Run("ProvisionCancelled", func(t *testing.T) {
		p := s.provider(t)
		cellID := uuid.Must(uuid.NewV7())
		cleanupDestroy(t, p, cellID)
		c, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		obj, err := p.Provision(c, driver.ProvisionRequest{CellID: cellID, RuntimeClass: s.class})
		if err == nil {
			t.Errorf("Provision with a cancelled context succeeded: %+v", obj)
		}
		if took := time.Since(start); took > prompt {
			t.Errorf("Provision with a cancelled context took %v, want at most %v", took, prompt)
		}
		s.requireCleanable(t, p, cellID)
	})
	for _, d := range []time.Duration{20 * time.Millisecond, 150 * time.Millisecond, 400 * time.Millisecond} {
		t.Run(fmt.Sprintf("ProvisionDeadline%s", d), func(t *testing.T) {
			p := s.provider(t)
			cellID := uuid.Must(uuid.NewV7())
			cleanupDestroy(t, p, cellID)
			c, cancel := context.WithTimeout(context.Background(), d)
			defer cancel()
			start := time.Now()
			// A fast provider may finish within the deadline; either way
			// the call must return promptly and leave nothing it cannot
			// destroy.
			_, err := p.Provision(c, driver.ProvisionRequest{CellID: cellID, RuntimeClass: s.class})
			if took := time.Since(start); took > d+prompt {
				t.Errorf("Provision with a %v deadline took %v (err %v)", d, took, err)
			}
			s.requireCleanable(t, p, cellID)
		})
	}
	t.Run("Exec", func(t *testing.T) {
		p := s.provider(t)
		e := s.execer(t, p)
		obj := s.provision(t, p)

		c, cancel := context.WithCancel(context.Background())
		cancel()
		start := time.Now()
		if _, err := e.Exec(c, obj, driver.ExecRequest{Argv: []string{"true"}, Timeout: time.Minute, MaxOutput: 1024}); err == nil {
			t.Error("Exec with a cancelled context succeeded")
		}
		if took := time.Since(start); took > prompt {
			t.Errorf("Exec with a cancelled context took %v", took)
		}

		secs := 600 + rand.IntN(300)
		c, cancel = context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		start = time.Now()
		res, err := e.Exec(c, obj, driver.ExecRequest{Argv: []string{"sleep", fmt.Sprint(secs)}, Timeout: time.Minute, MaxOutput: 1024})
		if err == nil {
			t.Errorf("Exec past its context's deadline succeeded: %+v", res)
		}
		if took := time.Since(start); took > 500*time.Millisecond+prompt {
			t.Errorf("Exec past its context's deadline took %v", took)
		}
		waitGone(t, e, obj, sleepMarker(secs))
		// The cell still works.
		if res := run(t, e, obj, driver.ExecRequest{Argv: []string{"printf", "ok"}}); string(res.Stdout) != "ok" {
			t.Errorf("cell unusable after a cancelled exec: exit %d, stdout %q, stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
}

// requireCleanable destroys whatever a cancelled Provision may have left for
// the cell and requires proof that it is gone, in this provider and in the
// listing.
func (s *suite) requireCleanable(t *testing.T, p driver.Provider, cellID uuid.UUID) {
	t.Helper()
	obj := driver.Object{CellID: cellID}
	if err := p.Destroy(ctx(t), obj); err != nil {
		t.Fatalf("Destroy after a cancelled Provision: %v", err)
	}
	requireAbsent(t, p, obj)
	if _, ok := p.(driver.Lister); ok {
		if n, mine := listCount(t, p, cellID); n != 0 {
			t.Errorf("List after Destroy holds %+v", mine)
		}
	}
}
