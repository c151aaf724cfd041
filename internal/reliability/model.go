package reliability

import (
	"fmt"
	"hash/fnv"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kind is the kind of one recorded operation.
type Kind uint8

// Operation kinds of the sterile-cell model.
const (
	// Claim is POST /v1/sterile-cells/claim under a claim_id (through the
	// Go client, which retries with the same claim_id and body).
	Claim Kind = iota + 1
	// Validate is POST /v1/sterile-cell-leases/{id}/validate.
	Validate
	// Release is POST /v1/sterile-cell-leases/{id}/release.
	Release
	// Status is GET /v1/sterile-cell-leases/{id}.
	Status
	// Destroy is the worker's POST …/sterile-cells/{cell_id}/destroy.
	Destroy
	// Prepare is the worker's POST …/sterile-cells/prepare.
	Prepare
	// Renew is POST /v1/sterile-cell-leases/{id}/renew (CONTRACT §20),
	// retried by the Go client with the same body.
	Renew
)

var kindNames = map[Kind]string{Claim: "claim", Validate: "validate", Release: "release",
	Status: "status", Destroy: "destroy", Prepare: "prepare", Renew: "renew"}

func (k Kind) String() string { return kindNames[k] }

// Input is the input of one operation.
type Input struct {
	Kind Kind
	// ClaimID and Digest (a label of the request body: two claims with the
	// same label have byte-identical bodies) for Claim.
	ClaimID, Digest string
	// Lease is the lease ID of Validate, Release, Status and Destroy.
	Lease string
	// Cell is the cell of Destroy and Prepare.
	Cell string
	// Disposition of Release and Destroy.
	Disposition string
	// BadProof marks a Validate that presents a wrong binding.
	BadProof bool
	// WrongLease marks a Destroy that names a lease the cell never had.
	WrongLease bool
	// LeaseSeconds is a Renew's lease_seconds as the server clamps it.
	LeaseSeconds uint64
	// CallWall and RetWall bound, in Unix microseconds of the wall clock
	// the servers share, when the operation (all its attempts) ran: a
	// renewal sets the expiry from a now between them. Zero when not
	// recorded.
	CallWall, RetWall int64
}

// Result is the class of an operation's answer.
type Result uint8

// Answer classes.
const (
	// OK is 200 or 202 (for Claim: a lease).
	OK Result = iota + 1
	// Empty is a claim answered with "lease": null.
	Empty
	// Conflict is any 409.
	Conflict
	// NotFound is 404.
	NotFound
	// Unknown is an operation whose effect is unknown: no definite answer
	// (every attempt lost or the server failed), or an answer that may
	// follow an earlier attempt whose response was lost and whose effect
	// the answer does not show (a 409 after a retry).
	Unknown
)

var resultNames = map[Result]string{OK: "ok", Empty: "empty", Conflict: "conflict", NotFound: "not_found", Unknown: "unknown"}

func (r Result) String() string { return resultNames[r] }

// Output is the answer of one operation.
type Output struct {
	Result Result
	// Lease and Cell of a claim that leased.
	Lease, Cell string
	// WorkerCell marks a leased cell prepared by an external worker (set
	// after the run from the prepares that succeeded).
	WorkerCell bool
	// State is the cell state reported by Status and Destroy.
	State string
	// Expiry is the lease's expires_at (Unix microseconds) answered by a
	// Claim that leased, a Validate or a Renew; zero when not recorded.
	Expiry int64
}

// The sequential specification. Each partition of the history (the claim
// IDs, leases and cells its operations connect) starts from nothing known.

type fenceState uint8

const (
	fenceEmpty   fenceState = iota + 1 // durably empty
	fenceLease                         // leased lease (may since have died)
	fencePending                       // an unknown operation may have leased an unseen cell
	fenceBurnt                         // leased a lease now dead, never seen
)

type fenceRec struct {
	digest string
	st     fenceState
	lease  string
}

type leaseState uint8

const (
	leaseLive     leaseState = iota + 1
	leaseStopping            // release recorded; the cell stays leased until the provider proves the stop
	leaseDead                // destroyed or quarantined: never validates again
)

type leaseRec struct {
	cell   string
	st     leaseState
	disp   string // disposition of the recorded stop
	worker bool
	final  string // terminal state once known
	// lo and hi bound the lease's current expiry (Unix microseconds): an
	// unknown renewal widens them; an answer that shows the expiry pins
	// them. Both zero: not recorded.
	lo, hi int64
}

type cellState uint8

const (
	cellReady cellState = iota + 1
	cellLeased
	cellTerminal
)

type cellRec struct {
	st    cellState
	lease string
	final string
}

// mstate is one partition's state. Step never mutates it: it returns
// copies.
type mstate struct {
	fences map[string]fenceRec
	leases map[string]leaseRec
	cells  map[string]cellRec
}

func newState() *mstate {
	return &mstate{fences: map[string]fenceRec{}, leases: map[string]leaseRec{}, cells: map[string]cellRec{}}
}

func (s *mstate) clone() *mstate {
	return &mstate{fences: maps.Clone(s.fences), leases: maps.Clone(s.leases), cells: maps.Clone(s.cells)}
}

// key is a canonical encoding, for equality and hashing.
func (s *mstate) key() string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(s.fences)) {
		f := s.fences[k]
		fmt.Fprintf(&b, "f%s=%s/%d/%s;", k, f.digest, f.st, f.lease)
	}
	for _, k := range slices.Sorted(maps.Keys(s.leases)) {
		l := s.leases[k]
		fmt.Fprintf(&b, "l%s=%s/%d/%s/%t/%s/%d/%d;", k, l.cell, l.st, l.disp, l.worker, l.final, l.lo, l.hi)
	}
	for _, k := range slices.Sorted(maps.Keys(s.cells)) {
		c := s.cells[k]
		fmt.Fprintf(&b, "c%s=%d/%s/%s;", k, c.st, c.lease, c.final)
	}
	return b.String()
}

// kill ends a lease and its cell; final is the terminal state when known.
func (s *mstate) kill(leaseID, final string) bool {
	l := s.leases[leaseID]
	if l.final != "" && final != "" && l.final != final {
		return false // a terminal cell never flips to the other terminal state
	}
	if final == "" {
		final = l.final
	}
	l.st, l.final = leaseDead, final
	s.leases[leaseID] = l
	s.cells[l.cell] = cellRec{st: cellTerminal, lease: leaseID, final: final}
	return true
}

// adopt records a new lease on a cell; false when the cell cannot be
// leased (already leased by another lease, terminal, or a worker cell not
// prepared yet).
func (s *mstate) adopt(leaseID, cellID string, worker bool, expiry int64) bool {
	if _, seen := s.leases[leaseID]; seen {
		return false
	}
	c, known := s.cells[cellID]
	switch {
	case worker && (!known || c.st != cellReady):
		return false
	case !worker && known:
		return false // pool cells are seen first by the claim that leases them
	}
	s.leases[leaseID] = leaseRec{cell: cellID, st: leaseLive, worker: worker, lo: expiry, hi: expiry}
	s.cells[cellID] = cellRec{st: cellLeased, lease: leaseID}
	return true
}

func one(s *mstate) []any { return []any{s} }

func stepClaim(s *mstate, in Input, out Output) []any {
	f, ok := s.fences[in.ClaimID]
	if out.Result == Unknown {
		next := one(s)
		if !ok {
			e := s.clone()
			e.fences[in.ClaimID] = fenceRec{digest: in.Digest, st: fenceEmpty}
			p := s.clone()
			p.fences[in.ClaimID] = fenceRec{digest: in.Digest, st: fencePending}
			next = append(next, e, p)
		}
		return next
	}
	if ok && f.digest != in.Digest {
		if out.Result == Conflict {
			return one(s)
		}
		return nil
	}
	switch out.Result {
	case OK:
		if ok && f.st == fenceLease {
			l := s.leases[f.lease]
			if f.lease == out.Lease && l.cell == out.Cell && l.st != leaseDead {
				return s.observeExpiry(f.lease, out.Expiry) // a fenced retry answers the current expiry
			}
			return nil
		}
		if ok && f.st != fencePending {
			return nil
		}
		n := s.clone()
		if !n.adopt(out.Lease, out.Cell, out.WorkerCell, out.Expiry) {
			return nil
		}
		n.fences[in.ClaimID] = fenceRec{digest: in.Digest, st: fenceLease, lease: out.Lease}
		return one(n)
	case Empty:
		if !ok {
			n := s.clone()
			n.fences[in.ClaimID] = fenceRec{digest: in.Digest, st: fenceEmpty}
			return one(n)
		}
		if f.st == fenceEmpty {
			return one(s)
		}
		return nil
	case Conflict:
		if !ok {
			return nil
		}
		switch f.st {
		case fenceBurnt:
			return one(s)
		case fencePending:
			n := s.clone()
			n.fences[in.ClaimID] = fenceRec{digest: in.Digest, st: fenceBurnt}
			return one(n)
		case fenceLease:
			switch s.leases[f.lease].st {
			case leaseDead:
				return one(s)
			case leaseStopping: // the stop completed
				n := s.clone()
				if n.kill(f.lease, "") {
					return one(n)
				}
			}
		}
	}
	return nil
}

func stepValidate(s *mstate, in Input, out Output) []any {
	l, ok := s.leases[in.Lease]
	switch {
	case out.Result == Unknown:
		return one(s)
	case !ok:
		return nil
	case in.BadProof:
		if out.Result == Conflict {
			return one(s)
		}
		return nil
	}
	switch {
	case out.Result == OK && l.st != leaseDead:
		return s.observeExpiry(in.Lease, out.Expiry)
	case out.Result == Conflict && l.st == leaseDead:
		return one(s)
	case out.Result == Conflict && l.st == leaseStopping:
		n := s.clone()
		if n.kill(in.Lease, "") {
			return one(n)
		}
	}
	return nil
}

func stepRelease(s *mstate, in Input, out Output) []any {
	l, ok := s.leases[in.Lease]
	if !ok {
		if out.Result == Unknown {
			return one(s)
		}
		return nil
	}
	if l.worker {
		// No membership: the lease fence, then 404; a worker destroys it.
		switch {
		case out.Result == Unknown,
			out.Result == NotFound && l.st == leaseLive,
			out.Result == Conflict && l.st == leaseDead:
			return one(s)
		}
		return nil
	}
	switch l.st {
	case leaseLive:
		n := s.clone()
		nl := l
		nl.st, nl.disp = leaseStopping, in.Disposition
		n.leases[in.Lease] = nl
		switch out.Result {
		case OK:
			return one(n)
		case Unknown:
			return []any{s, n}
		}
	case leaseStopping:
		// A 409 means the stop completed (the cell took the recorded
		// disposition, or quarantined) or, for another disposition, a
		// cleanup fence mismatch (quarantined): the 409 alone does not say
		// which, so the terminal state is left to later observations.
		dead := s.clone()
		dead.kill(in.Lease, "")
		switch {
		case out.Result == OK && in.Disposition == l.disp:
			return one(s)
		case out.Result == Conflict:
			return one(dead)
		case out.Result == Unknown:
			return []any{s, dead}
		}
	case leaseDead:
		if out.Result == Conflict || out.Result == Unknown {
			return one(s)
		}
	}
	return nil
}

func stepStatus(s *mstate, in Input, out Output) []any {
	l, ok := s.leases[in.Lease]
	switch {
	case out.Result == Unknown:
		return one(s)
	case !ok || out.Result != OK:
		return nil
	case out.State == "leased":
		if l.st != leaseDead {
			return one(s)
		}
		return nil
	case out.State != "destroyed" && out.State != "quarantined":
		return nil
	case l.st == leaseLive:
		return nil
	case l.disp != "" && out.State != l.disp && out.State != "quarantined":
		return nil // a stop ends in its disposition, or quarantined
	}
	n := s.clone()
	if n.kill(in.Lease, out.State) {
		return one(n)
	}
	return nil
}

func stepDestroy(s *mstate, in Input, out Output) []any {
	c, ok := s.cells[in.Cell]
	if !ok {
		if out.Result == NotFound || out.Result == Unknown {
			return one(s)
		}
		return nil
	}
	n := s.clone()
	want := Conflict
	switch c.st {
	case cellReady:
		n.cells[in.Cell] = cellRec{st: cellTerminal, final: "quarantined"}
	case cellLeased:
		if !in.WrongLease && in.Lease == c.lease {
			want = OK
			if !n.kill(c.lease, in.Disposition) {
				return nil
			}
		} else if !n.kill(c.lease, "quarantined") {
			return nil
		}
	case cellTerminal:
		if !in.WrongLease && in.Lease == c.lease && c.final == in.Disposition {
			want = OK // an exact replay
		}
	}
	switch {
	case out.Result == Unknown:
		return []any{s, n}
	case out.Result != want:
		return nil
	case want == OK && out.State != in.Disposition:
		return nil
	}
	return one(n)
}

func stepPrepare(s *mstate, in Input, out Output) []any {
	if _, known := s.cells[in.Cell]; known || out.Result != OK {
		return nil
	}
	n := s.clone()
	n.cells[in.Cell] = cellRec{st: cellReady}
	return one(n)
}

// expirySlack absorbs the distance between the harness's reading of the
// wall clock and the server's (the same host's clock, or the database's):
// far below any extension the harness asks for.
const expirySlack = int64(time.Second / time.Microsecond)

// observeExpiry accepts an answer that shows leaseID's current expiry e
// (zero: not shown) when e is within what the model allows, and pins it.
func (s *mstate) observeExpiry(leaseID string, e int64) []any {
	l := s.leases[leaseID]
	if e == 0 || l.hi == 0 {
		return one(s)
	}
	if e < l.lo-expirySlack || e > l.hi+expirySlack {
		return nil
	}
	n := s.clone()
	l.lo, l.hi = e, e
	n.leases[leaseID] = l
	return one(n)
}

// renewBounds is the range of the expiry after a renewal of l ran at some
// now in [in.CallWall, in.RetWall] (CONTRACT §20): max(current, now +
// lease_seconds). However often it was retried, each attempt sets the
// expiry from its own now, so the extensions never add up. The lifetime
// cap is far beyond any run's renewals, so it never binds here.
func renewBounds(l leaseRec, in Input) (lo, hi int64) {
	ext := int64(in.LeaseSeconds) * int64(time.Second/time.Microsecond)
	return max(l.lo, in.CallWall+ext), max(l.hi, in.RetWall+ext)
}

func stepRenew(s *mstate, in Input, out Output) []any {
	l, ok := s.leases[in.Lease]
	switch {
	case !ok && out.Result == Unknown:
		return one(s)
	case !ok:
		return nil
	case out.Result == Unknown:
		if l.st != leaseLive || l.hi == 0 || in.CallWall == 0 {
			return one(s)
		}
		n := s.clone()
		nl := l
		nl.lo, nl.hi = renewBounds(l, in)
		n.leases[in.Lease] = nl
		return []any{s, n} // lost, or renewed
	}
	switch l.st {
	case leaseLive:
		// Never shorter, never two extensions; nothing but the expiry
		// changes. Leases outlive the run: a live one is never expired.
		if out.Result != OK {
			return nil
		}
		if l.hi == 0 || in.CallWall == 0 || out.Expiry == 0 {
			return one(s)
		}
		lo, hi := renewBounds(l, in)
		if out.Expiry < lo-expirySlack || out.Expiry > hi+expirySlack {
			return nil
		}
		n := s.clone()
		nl := l
		nl.lo, nl.hi = out.Expiry, out.Expiry
		n.leases[in.Lease] = nl
		return one(n)
	case leaseStopping, leaseDead:
		// The stop is recorded: 409, and nothing changes (a 409 alone
		// does not say whether the stop completed).
		if out.Result == Conflict {
			return one(s)
		}
	}
	return nil
}

func step(state, input, output any) []any {
	s, in, out := state.(*mstate), input.(Input), output.(Output)
	switch in.Kind {
	case Claim:
		return stepClaim(s, in, out)
	case Validate:
		return stepValidate(s, in, out)
	case Release:
		return stepRelease(s, in, out)
	case Status:
		return stepStatus(s, in, out)
	case Destroy:
		return stepDestroy(s, in, out)
	case Prepare:
		return stepPrepare(s, in, out)
	case Renew:
		return stepRenew(s, in, out)
	}
	return nil
}

// keys returns the entities an operation touches: the claim ID, the lease
// and the cell. Operations that share an entity share a partition.
func keys(op porcupine.Operation) []string {
	in, out := op.Input.(Input), op.Output.(Output)
	var k []string
	if in.ClaimID != "" {
		k = append(k, "claim:"+in.ClaimID)
	}
	if in.Lease != "" && !in.WrongLease {
		k = append(k, "lease:"+in.Lease)
	}
	if in.Cell != "" {
		k = append(k, "cell:"+in.Cell)
	}
	if out.Lease != "" {
		k = append(k, "lease:"+out.Lease, "cell:"+out.Cell)
	}
	return k
}

// partition splits a history into the connected components of the graph
// of claim IDs, leases and cells. The model's state is a product of
// independent per-entity states linked only through operations, so the
// history is linearizable if and only if every component is.
func partition(history []porcupine.Operation) [][]porcupine.Operation {
	parent := map[string]string{}
	var find func(string) string
	find = func(x string) string {
		p, ok := parent[x]
		if !ok || p == x {
			parent[x] = x
			return x
		}
		r := find(p)
		parent[x] = r
		return r
	}
	for _, op := range history {
		k := keys(op)
		for _, x := range k[1:] {
			parent[find(x)] = find(k[0])
		}
	}
	groups := map[string][]porcupine.Operation{}
	var order []string
	for _, op := range history {
		r := find(keys(op)[0])
		if _, ok := groups[r]; !ok {
			order = append(order, r)
		}
		groups[r] = append(groups[r], op)
	}
	out := make([][]porcupine.Operation, 0, len(order))
	for _, r := range order {
		out = append(out, groups[r])
	}
	return out
}

func describeOperation(input, output any) string {
	in, out := input.(Input), output.(Output)
	short := func(id string) string {
		if len(id) > 8 {
			return id[len(id)-8:]
		}
		return id
	}
	var args string
	switch in.Kind {
	case Claim:
		args = short(in.ClaimID) + "," + in.Digest
	case Validate:
		args = short(in.Lease)
		if in.BadProof {
			args += ",bad-proof"
		}
	case Release:
		args = short(in.Lease) + "," + in.Disposition
	case Status:
		args = short(in.Lease)
	case Destroy:
		args = short(in.Cell) + "," + short(in.Lease) + "," + in.Disposition
		if in.WrongLease {
			args += ",wrong-lease"
		}
	case Prepare:
		args = short(in.Cell)
	case Renew:
		args = fmt.Sprintf("%s,%ds,at[%d,%d]", short(in.Lease), in.LeaseSeconds, in.CallWall, in.RetWall)
	}
	res := out.Result.String()
	switch {
	case out.Lease != "":
		res = fmt.Sprintf("lease %s cell %s", short(out.Lease), short(out.Cell))
		if out.WorkerCell {
			res += " (worker)"
		}
	case out.State != "":
		res += " " + out.State
	}
	if out.Expiry != 0 {
		res += fmt.Sprintf(" expires %d", out.Expiry)
	}
	return fmt.Sprintf("%s(%s) -> %s", in.Kind, args, res)
}

// Model is the porcupine model of the sterile-cell contract: per claim
// fence, per lease and per cell. Read the doc comment of the package for
// what it accepts.
func Model() porcupine.Model {
	nm := porcupine.NondeterministicModel{
		Partition: partition,
		Init:      func() []any { return []any{newState()} },
		Step:      step,
		Equal:     func(a, b any) bool { return a.(*mstate).key() == b.(*mstate).key() },
		Hash: func(s any) uint64 {
			h := fnv.New64a()
			_, _ = h.Write([]byte(s.(*mstate).key()))
			return h.Sum64()
		},
		DescribeOperation: describeOperation,
		DescribeState:     func(s any) string { return s.(*mstate).key() },
	}
	return nm.ToModel()
}
