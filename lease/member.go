package lease

// MemberState is the state of a pool membership (CONTRACT §4.2): the pool's
// record of one provider object and the cell it backs.
type MemberState string

// Pool-membership states.
const (
	MemberProvisioning   MemberState = "provisioning"
	MemberReady          MemberState = "ready"
	MemberLeased         MemberState = "leased"
	MemberStopping       MemberState = "stopping"
	MemberCleanupPending MemberState = "cleanup_pending"
	MemberDestroyed      MemberState = "destroyed"
	MemberQuarantined    MemberState = "quarantined"
)

// MemberStates lists every membership state in life-cycle order.
var MemberStates = []MemberState{
	MemberProvisioning, MemberReady, MemberLeased, MemberStopping,
	MemberCleanupPending, MemberDestroyed, MemberQuarantined,
}

// Valid reports whether s is a defined membership state.
func (s MemberState) Valid() bool {
	for _, m := range MemberStates {
		if s == m {
			return true
		}
	}
	return false
}

// Terminal reports whether the membership has ended with proof.
func (s MemberState) Terminal() bool { return s == MemberDestroyed || s == MemberQuarantined }

// Live reports whether the membership counts against the pool's target.
// Only provider-confirmed completion frees a slot.
func (s MemberState) Live() bool { return s.Valid() && !s.Terminal() }

var memberTransitions = map[MemberState][]MemberState{
	MemberProvisioning:   {MemberReady, MemberStopping},
	MemberReady:          {MemberLeased, MemberStopping},
	MemberLeased:         {MemberStopping, MemberCleanupPending},
	MemberStopping:       {MemberDestroyed, MemberQuarantined, MemberCleanupPending},
	MemberCleanupPending: {MemberDestroyed, MemberQuarantined, MemberCleanupPending},
}

// CheckMemberTransition returns nil when a membership may move from one
// state to another, and a *TransitionError otherwise. cleanup_pending may be
// re-entered: each failed retry records itself.
func CheckMemberTransition(from, to MemberState) error {
	for _, s := range memberTransitions[from] {
		if s == to {
			return nil
		}
	}
	return &TransitionError{Kind: "member", From: string(from), To: string(to)}
}
