// Package lease holds the vocabulary of sterile cells: runtime classes, cell
// and pool-member states, dispositions, generations, releases, tenant
// bindings, leases, and the transition tables of CONTRACT §4 as pure code.
//
// Nothing here performs I/O. Stores and the plane use these tables to decide
// what a compare-and-set may do; the database schema enforces the same rules
// a second time.
package lease

import (
	"errors"
	"fmt"
	"time"

	"github.com/google/uuid"
)

// RuntimeClass is the isolation class a release is signed for.
type RuntimeClass string

// Runtime classes. A claim for one class never consumes inventory of the
// other.
const (
	// KataMicroVM is the VM-equivalent class.
	KataMicroVM RuntimeClass = "kata_microvm"
	// GVisorLowerRisk is for workloads whose threat model permits a shared
	// host kernel behind gVisor.
	GVisorLowerRisk RuntimeClass = "gvisor_lower_risk"
)

// Valid reports whether c is one of the defined classes.
func (c RuntimeClass) Valid() bool { return c == KataMicroVM || c == GVisorLowerRisk }

// State is the state of a cell.
type State string

// Cell states (CONTRACT §4.1).
const (
	Ready       State = "ready"
	Leased      State = "leased"
	Destroyed   State = "destroyed"
	Quarantined State = "quarantined"
)

// Valid reports whether s is a defined cell state.
func (s State) Valid() bool {
	switch s {
	case Ready, Leased, Destroyed, Quarantined:
		return true
	}
	return false
}

// Terminal reports whether s is a terminal state.
func (s State) Terminal() bool { return s == Destroyed || s == Quarantined }

// Disposition is how a leased cell ends: one of the two terminal states.
type Disposition = State

// ValidDisposition reports whether d names a terminal state.
func ValidDisposition(d Disposition) bool { return d.Terminal() }

// Generations. The claim is the only transition that changes a generation.
const (
	GenerationReady  uint64 = 1
	GenerationLeased uint64 = 2
)

// Release is the signed trust class a cell is prepared for and a claim asks
// for. All four fields take part in matching.
type Release struct {
	ReleaseSetID string       `json:"release_set_id"`
	RuntimeClass RuntimeClass `json:"runtime_class"`
	PolicyDigest string       `json:"policy_digest"`
	Signature    string       `json:"signature"`
}

// Binding is the tenant-side identity a lease is bound to.
type Binding struct {
	OrganizationID  string `json:"organization_id"`
	WorkspaceID     string `json:"workspace_id"`
	ThreadID        string `json:"thread_id"`
	RunnerSessionID string `json:"runner_session_id"`
}

// Lease is one tenant's exclusive, time-bounded right to one cell.
type Lease struct {
	ID         uuid.UUID
	CellID     uuid.UUID
	Generation uint64
	Release    Release
	Binding    Binding
	// ExpiresAt is when the lease ends: the expiry the claim granted, or a
	// later one a renewal set (CONTRACT §20).
	ExpiresAt time.Time
	// GrantedExpiresAt is the expiry the claim granted, which the lease
	// attestation's MAC covers; equal to ExpiresAt until a renewal.
	GrantedExpiresAt time.Time
	// LeasedAt is when the claim leased the cell, from which a pool's cell
	// lifetime cap counts; zero for a lease made before renewal existed.
	LeasedAt time.Time
	// AttestationDigest is the SHA-256 hex digest of the attestation token.
	// The token itself is never stored.
	AttestationDigest string
}

// Cell is a sterile cell as the store holds it.
type Cell struct {
	ID       uuid.UUID
	TenantID string
	// WorkerID is the external worker that prepared the cell, or the pool's
	// provider identity ("pool:<name>") for pool cells.
	WorkerID       string
	PoolName       string // empty for cells prepared by an external worker
	ProviderCellID string
	State          State
	Generation     uint64
	Release        Release
	// ExpiresAt is the ready deadline: after it the cell may not be claimed.
	ExpiresAt time.Time
	CreatedAt time.Time
	// Lease is set once the cell was claimed, and stays on terminal rows.
	Lease *Lease
}

// Disposition returns the terminal state, or "" while the cell is live.
func (c *Cell) Disposition() Disposition {
	if c.State.Terminal() {
		return c.State
	}
	return ""
}

// LeaseLive reports whether the cell is leased and its lease has not expired
// at now.
func (c *Cell) LeaseLive(now time.Time) bool {
	return c.State == Leased && c.Lease != nil && now.Before(c.Lease.ExpiresAt)
}

// ErrIllegalTransition is returned (wrapped in a *TransitionError) for a
// state change the contract does not allow.
var ErrIllegalTransition = errors.New("illegal state transition")

// TransitionError describes a refused transition.
type TransitionError struct {
	Kind     string // "cell" or "member"
	From, To string
}

func (e *TransitionError) Error() string {
	return fmt.Sprintf("%s: %s %q -> %q", ErrIllegalTransition, e.Kind, e.From, e.To)
}

// Unwrap returns ErrIllegalTransition.
func (e *TransitionError) Unwrap() error { return ErrIllegalTransition }

// cellTransitions is CONTRACT §4.1: nothing returns to ready, a terminal cell
// never flips to the other terminal state.
var cellTransitions = map[State][]State{
	Ready:  {Leased, Quarantined},
	Leased: {Destroyed, Quarantined},
}

// CheckCellTransition returns nil when a cell may move from one state to
// another, and a *TransitionError otherwise. A state "moving" to itself is
// not a transition and is refused too.
func CheckCellTransition(from, to State) error {
	for _, s := range cellTransitions[from] {
		if s == to {
			return nil
		}
	}
	return &TransitionError{Kind: "cell", From: string(from), To: string(to)}
}

// TerminalFor returns the terminal state a cell in state current ends in when
// disposition d is requested: a cell already terminal keeps its state (a
// quarantined cell stays quarantined even if destroyed was requested), and a
// ready cell can only be quarantined.
func TerminalFor(current State, d Disposition) State {
	switch {
	case current.Terminal():
		return current
	case current == Ready:
		return Quarantined
	default:
		return d
	}
}
