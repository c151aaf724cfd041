package reliability

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// h builds a history: each op is [call, return) on its own client unless
// the client is given.
type hb struct{ ops []porcupine.Operation }

func (b *hb) add(client int, call, ret int64, in Input, out Output) *hb {
	b.ops = append(b.ops, porcupine.Operation{ClientId: client, Call: call, Return: ret, Input: in, Output: out})
	return b
}

func claim(id, digest string) Input  { return Input{Kind: Claim, ClaimID: id, Digest: digest} }
func leased(l, c string) Output      { return Output{Result: OK, Lease: l, Cell: c} }
func res(r Result) Output            { return Output{Result: r} }
func validate(l string) Input        { return Input{Kind: Validate, Lease: l} }
func status(l string) Input          { return Input{Kind: Status, Lease: l} }
func state(s string) Output          { return Output{Result: OK, State: s} }
func release(l, d string) Input      { return Input{Kind: Release, Lease: l, Disposition: d} }
func prepare(c string) Input         { return Input{Kind: Prepare, Cell: c} }
func destroyIn(c, l, d string) Input { return Input{Kind: Destroy, Cell: c, Lease: l, Disposition: d} }

func TestModelAcceptsLegalHistories(t *testing.T) {
	for name, b := range map[string]*hb{
		"pool lease life cycle with retries and replays": new(hb).
			add(0, 0, 10, claim("x", "d"), leased("L1", "C1")).
			add(1, 5, 12, claim("x", "d"), leased("L1", "C1")). // concurrent identical claim
			add(0, 11, 13, validate("L1"), res(OK)).
			add(0, 14, 15, release("L1", "destroyed"), res(OK)).
			add(1, 16, 17, release("L1", "destroyed"), res(OK)). // exact retry while stopping
			add(0, 18, 19, validate("L1"), res(OK)).             // still leased until the provider proves the stop
			add(0, 20, 21, status("L1"), state("destroyed")).
			add(0, 22, 23, validate("L1"), res(Conflict)).
			add(1, 24, 25, claim("x", "d"), res(Conflict)). // the lease is no longer live
			add(1, 26, 27, claim("x", "other"), res(Conflict)),
		"empty is sticky, and a digest mismatch conflicts": new(hb).
			add(0, 0, 1, claim("y", "d"), res(Empty)).
			add(1, 2, 3, claim("y", "d"), res(Empty)).
			add(2, 4, 5, claim("y", "e"), res(Conflict)),
		"an unknown claim may have leased a cell seen later": new(hb).
			add(0, 0, 100, claim("z", "d"), res(Unknown)).
			add(1, 10, 20, claim("z", "d"), leased("L2", "C2")),
		"worker cell: prepare, claim, destroy, replayed destroy": new(hb).
			add(9, 0, 1, prepare("W1"), res(OK)).
			add(0, 2, 3, claim("w", "d"), Output{Result: OK, Lease: "L3", Cell: "W1", WorkerCell: true}).
			add(0, 4, 5, release("L3", "destroyed"), Output{Result: NotFound}).
			add(0, 6, 7, destroyIn("W1", "L3", "destroyed"), state("destroyed")).
			add(1, 8, 9, destroyIn("W1", "L3", "destroyed"), state("destroyed")).
			add(0, 10, 11, validate("L3"), res(Conflict)).
			add(0, 12, 13, status("L3"), state("destroyed")),
		"a 409 on a release retry after a lost answer": new(hb).
			add(0, 0, 1, claim("r", "d"), leased("L4", "C4")).
			add(0, 2, 9, release("L4", "destroyed"), res(Unknown)).
			add(0, 10, 11, validate("L4"), res(Conflict)),
	} {
		t.Run(name, func(t *testing.T) {
			if r := porcupine.CheckOperationsTimeout(Model(), b.ops, 10*time.Second); r != porcupine.Ok {
				t.Fatalf("legal history judged %s", r)
			}
		})
	}
}

func TestModelRejectsViolations(t *testing.T) {
	for name, b := range map[string]*hb{
		"a cell leased by two leases": new(hb).
			add(0, 0, 1, claim("a", "d"), leased("L1", "C1")).
			add(1, 2, 3, claim("b", "d"), leased("L2", "C1")),
		"a retry that returns another lease": new(hb).
			add(0, 0, 1, claim("a", "d"), leased("L1", "C1")).
			add(0, 2, 3, claim("a", "d"), leased("L2", "C2")),
		"empty that is not sticky": new(hb).
			add(0, 0, 1, claim("a", "d"), res(Empty)).
			add(0, 2, 3, claim("a", "d"), leased("L1", "C1")),
		"a lease that validates again after it died": new(hb).
			add(0, 0, 1, claim("a", "d"), leased("L1", "C1")).
			add(0, 2, 3, release("L1", "destroyed"), res(OK)).
			add(0, 4, 5, validate("L1"), res(Conflict)).
			add(0, 6, 7, validate("L1"), res(OK)),
		"a live lease refused": new(hb).
			add(0, 0, 1, claim("a", "d"), leased("L1", "C1")).
			add(0, 2, 3, validate("L1"), res(Conflict)),
		"a terminal cell that flips": new(hb).
			add(0, 0, 1, claim("a", "d"), leased("L1", "C1")).
			add(0, 2, 3, release("L1", "quarantined"), res(OK)).
			add(0, 4, 5, status("L1"), state("quarantined")).
			add(0, 6, 7, status("L1"), state("destroyed")),
		"a stop that ends in another disposition": new(hb).
			add(0, 0, 1, claim("a", "d"), leased("L1", "C1")).
			add(0, 2, 3, release("L1", "quarantined"), res(OK)).
			add(0, 4, 5, status("L1"), state("destroyed")),
		"a worker cell leased before it was prepared": new(hb).
			add(0, 0, 1, claim("a", "d"), Output{Result: OK, Lease: "L1", Cell: "W1", WorkerCell: true}).
			add(9, 2, 3, prepare("W1"), res(OK)),
		"a quarantined worker cell claimed": new(hb).
			add(9, 0, 1, prepare("W1"), res(OK)).
			add(1, 2, 3, Input{Kind: Destroy, Cell: "W1", Lease: "X", Disposition: "quarantined", WrongLease: true}, res(Conflict)).
			add(0, 4, 5, claim("a", "d"), Output{Result: OK, Lease: "L1", Cell: "W1", WorkerCell: true}),
		"a destroy with a wrong lease that leaves the lease live": new(hb).
			add(9, 0, 1, prepare("W1"), res(OK)).
			add(0, 2, 3, claim("a", "d"), Output{Result: OK, Lease: "L1", Cell: "W1", WorkerCell: true}).
			add(1, 4, 5, Input{Kind: Destroy, Cell: "W1", Lease: "X", Disposition: "quarantined", WrongLease: true}, res(Conflict)).
			add(0, 6, 7, validate("L1"), res(OK)),
		"a claim with another digest that leases": new(hb).
			add(0, 0, 1, claim("a", "d"), res(Empty)).
			add(0, 2, 3, claim("a", "e"), leased("L1", "C1")),
	} {
		t.Run(name, func(t *testing.T) {
			if r := porcupine.CheckOperationsTimeout(Model(), b.ops, 10*time.Second); r != porcupine.Illegal {
				t.Fatalf("violation judged %s", r)
			}
		})
	}
}

func TestPartitionKeepsLinkedOperationsTogether(t *testing.T) {
	b := new(hb).
		add(0, 0, 1, claim("a", "d"), leased("L1", "C1")).
		add(1, 0, 1, claim("b", "d"), res(Empty)).
		add(0, 2, 3, validate("L1"), res(OK)).
		add(2, 4, 5, Input{Kind: Destroy, Cell: "C9", Lease: "L1", WrongLease: true}, res(NotFound))
	parts := partition(b.ops)
	if len(parts) != 3 || len(parts[0]) != 2 {
		t.Fatalf("partitions %v", parts)
	}
}

func TestCheckObjects(t *testing.T) {
	s := Snapshot{
		Cells: map[string]CellRow{"r": {ID: "r", State: "ready"}, "d": {ID: "d", State: "destroyed"}},
		Members: map[string]MemberRow{"r": {Cell: "r", State: "ready"}, "p": {Cell: "p", State: "provisioning"},
			"d": {Cell: "d", State: "destroyed", ProviderAbsent: true}},
	}
	if bad := CheckObjects(s, []string{"r", "p"}, false); len(bad) != 0 {
		t.Fatalf("consistent state flagged: %v", bad)
	}
	for name, objs := range map[string][]string{
		"leaked object of a terminal member": {"r", "d"},
		"object without a member":            {"r", "zz"},
		"ready member without its object":    {},
	} {
		if bad := CheckObjects(s, objs, false); len(bad) == 0 {
			t.Errorf("%s: not flagged", name)
		}
	}
	if bad := CheckObjects(s, []string{"r", "p"}, true); len(bad) == 0 {
		t.Error("a member still provisioning after convergence is not flagged")
	}
}

func TestHistoryFlagsViolations(t *testing.T) {
	snap := func(state, l string, live int) Snapshot {
		s := Snapshot{Cells: map[string]CellRow{"c": {ID: "c", State: state, Lease: l, Generation: 1}}, Members: map[string]MemberRow{}}
		for i := range live {
			s.Members[string(rune('a'+i))] = MemberRow{State: "ready"}
		}
		return s
	}
	h := NewHistory(2)
	h.Observe(snap("leased", "L1", 1))
	h.Observe(snap("ready", "L1", 1))
	h.Observe(snap("leased", "L2", 3))
	h.Claimed("L3", "c")
	if v := h.Violations(); len(v) < 4 {
		t.Fatalf("want back-to-ready, lease change, above target and leased twice flagged, got %v", v)
	}
}

func TestDropProxy(t *testing.T) {
	var hits atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		_, _ = w.Write(b)
	}))
	defer backend.Close()
	for _, rate := range []float64{0, 1} {
		p, err := NewDropProxy([]string{backend.URL}, rate, 1)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Post(p.URL+"/x", "text/plain", strings.NewReader("hello"))
		switch {
		case rate == 0 && err != nil:
			t.Fatalf("rate 0: %v", err)
		case rate == 0:
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(b) != "hello" {
				t.Fatalf("rate 0: body %q", b)
			}
		case err == nil:
			resp.Body.Close()
			t.Fatal("rate 1: the answer reached the client")
		}
		p.Close()
		if req, dropped, _, _ := p.Stats(); req != 1 || dropped != int64(rate) {
			t.Fatalf("rate %v: stats %d requests, %d dropped", rate, req, dropped)
		}
	}
	if hits.Load() != 2 {
		t.Fatalf("backend saw %d requests, want 2 (a dropped answer is still served)", hits.Load())
	}
}

// Renewal histories: times in seconds of the wall clock, expiries in
// Unix microseconds.
const sec = int64(1_000_000)

func leasedAt(l, c string, expiry int64) Output {
	return Output{Result: OK, Lease: l, Cell: c, Expiry: expiry}
}

func renewIn(l string, ls uint64, call, ret int64) Input {
	return Input{Kind: Renew, Lease: l, LeaseSeconds: ls, CallWall: call * sec, RetWall: ret * sec}
}

func expires(e int64) Output { return Output{Result: OK, Expiry: e * sec} }

func TestModelRenewals(t *testing.T) {
	base := func() *hb { return new(hb).add(0, 0, 1, claim("a", "d"), leasedAt("L1", "C1", 300*sec)) }
	legal := map[string]*hb{
		"renew extends from its own now": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 101), expires(400)).
			add(0, 4, 5, Input{Kind: Validate, Lease: "L1"}, expires(400)),
		"a shorter request changes nothing": base().
			add(0, 2, 3, renewIn("L1", 30, 100, 101), expires(300)),
		"a retried renewal after a lost answer extends once": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 120), expires(420)),
		"an unknown renewal may or may not have happened": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 101), res(Unknown)).
			add(0, 4, 5, Input{Kind: Validate, Lease: "L1"}, expires(400)),
		"an unknown renewal that did not happen": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 101), res(Unknown)).
			add(0, 4, 5, Input{Kind: Validate, Lease: "L1"}, expires(300)),
		"a fenced claim retry answers the current expiry": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 101), expires(400)).
			add(1, 4, 5, claim("a", "d"), leasedAt("L1", "C1", 400*sec)),
		"renew after the release conflicts": base().
			add(0, 2, 3, release("L1", "destroyed"), res(OK)).
			add(0, 4, 5, renewIn("L1", 300, 100, 101), res(Conflict)).
			add(0, 6, 7, validate("L1"), res(OK)),
	}
	for name, b := range legal {
		t.Run("legal/"+name, func(t *testing.T) {
			if r := porcupine.CheckOperationsTimeout(Model(), b.ops, 10*time.Second); r != porcupine.Ok {
				t.Fatalf("legal history judged %s", r)
			}
		})
	}
	illegal := map[string]*hb{
		"two extensions": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 101), expires(700)),
		"shorter": base().
			add(0, 2, 3, renewIn("L1", 30, 100, 101), expires(130)),
		"an extension not from the renewal's now": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 101), expires(350)),
		"a renewal lost afterwards": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 101), expires(400)).
			add(0, 4, 5, Input{Kind: Validate, Lease: "L1"}, expires(300)),
		"a claim retry with the old expiry after a renewal": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 101), expires(400)).
			add(1, 4, 5, claim("a", "d"), leasedAt("L1", "C1", 300*sec)),
		"renew after the release succeeds": base().
			add(0, 2, 3, release("L1", "destroyed"), res(OK)).
			add(0, 4, 5, renewIn("L1", 300, 100, 101), expires(400)),
		"a live lease refused renewal": base().
			add(0, 2, 3, renewIn("L1", 300, 100, 101), res(Conflict)),
	}
	for name, b := range illegal {
		t.Run("illegal/"+name, func(t *testing.T) {
			if r := porcupine.CheckOperationsTimeout(Model(), b.ops, 10*time.Second); r != porcupine.Illegal {
				t.Fatalf("violation judged %s", r)
			}
		})
	}
}
