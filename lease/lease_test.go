package lease

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var allStates = []State{Ready, Leased, Destroyed, Quarantined}

func TestCellTransitionsExhaustive(t *testing.T) {
	allowed := map[[2]State]bool{
		{Ready, Leased}: true, {Ready, Quarantined}: true,
		{Leased, Destroyed}: true, {Leased, Quarantined}: true,
	}
	for _, from := range append(allStates, "bogus") {
		for _, to := range append(allStates, "bogus") {
			err := CheckCellTransition(from, to)
			if allowed[[2]State{from, to}] != (err == nil) {
				t.Errorf("%s -> %s: %v", from, to, err)
			}
			if err != nil && !errors.Is(err, ErrIllegalTransition) {
				t.Errorf("%s -> %s: error %v is not ErrIllegalTransition", from, to, err)
			}
			if to == Ready && err == nil {
				t.Errorf("%s -> ready allowed: nothing may return to ready", from)
			}
		}
	}
}

func TestMemberTransitionsExhaustive(t *testing.T) {
	for _, from := range MemberStates {
		for _, to := range MemberStates {
			err := CheckMemberTransition(from, to)
			if from.Terminal() && err == nil {
				t.Errorf("terminal %s -> %s allowed", from, to)
			}
			if to == MemberProvisioning && err == nil {
				t.Errorf("%s -> provisioning allowed", from)
			}
			if to == MemberReady && from != MemberProvisioning && err == nil {
				t.Errorf("%s -> ready allowed", from)
			}
		}
	}
	for _, ok := range [][2]MemberState{
		{MemberProvisioning, MemberReady}, {MemberReady, MemberLeased}, {MemberLeased, MemberStopping},
		{MemberStopping, MemberDestroyed}, {MemberStopping, MemberCleanupPending}, {MemberCleanupPending, MemberQuarantined},
	} {
		if err := CheckMemberTransition(ok[0], ok[1]); err != nil {
			t.Errorf("%s -> %s refused: %v", ok[0], ok[1], err)
		}
	}
}

func TestLiveAndTerminal(t *testing.T) {
	live := 0
	for _, s := range MemberStates {
		if s.Live() == s.Terminal() {
			t.Errorf("%s: live %v terminal %v", s, s.Live(), s.Terminal())
		}
		if s.Live() {
			live++
		}
	}
	if live != 5 || MemberState("x").Live() {
		t.Fatalf("live states = %d", live)
	}
}

func TestTerminalFor(t *testing.T) {
	for _, tc := range []struct {
		cur  State
		d    Disposition
		want State
	}{
		{Leased, Destroyed, Destroyed}, {Leased, Quarantined, Quarantined},
		{Ready, Destroyed, Quarantined}, {Quarantined, Destroyed, Quarantined}, {Destroyed, Quarantined, Destroyed},
	} {
		if got := TerminalFor(tc.cur, tc.d); got != tc.want {
			t.Errorf("TerminalFor(%s, %s) = %s, want %s", tc.cur, tc.d, got, tc.want)
		}
	}
}

func TestIdentifiers(t *testing.T) {
	for _, tc := range []struct {
		s  string
		ok bool
	}{
		{"a", true}, {"org-1", true}, {"A.b_c:d/e-9", true}, {strings.Repeat("x", 256), true},
		{"", false}, {strings.Repeat("x", 257), false}, {"a b", false}, {"a\x00", false}, {"ｏrg", false},
		{"оrg", false}, {"a\n", false}, {"a+b", false}, {"a@b", false}, {"é", false},
	} {
		if ValidIdentifier(tc.s) != tc.ok {
			t.Errorf("ValidIdentifier(%q) = %v", tc.s, !tc.ok)
		}
	}
	if !ValidPolicyDigest(strings.Repeat("a", 64)) || ValidPolicyDigest(strings.Repeat("A", 64)) ||
		ValidPolicyDigest(strings.Repeat("a", 63)) || ValidPolicyDigest(strings.Repeat("g", 64)) {
		t.Fatal("policy digest rule")
	}
}

func TestCheckProof(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b := Binding{"o", "w", "t", "s"}
	c := &Cell{State: Leased, Generation: 2, Lease: &Lease{Binding: b, ExpiresAt: now.Add(time.Minute), AttestationDigest: "d"}}
	good := Proof{Generation: 2, Binding: b, AttestationDigest: "d"}
	if err := c.CheckProof(good, now); err != nil {
		t.Fatal(err)
	}
	for name, p := range map[string]Proof{
		"generation": {Generation: 1, Binding: b, AttestationDigest: "d"},
		"digest":     {Generation: 2, Binding: b, AttestationDigest: "e"},
		"org":        {Generation: 2, Binding: Binding{"x", "w", "t", "s"}, AttestationDigest: "d"},
		"session":    {Generation: 2, Binding: Binding{"o", "w", "t", "x"}, AttestationDigest: "d"},
	} {
		if err := c.CheckProof(p, now); !errors.Is(err, ErrFenceMismatch) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := c.CheckProof(good, now.Add(time.Minute)); !errors.Is(err, ErrNotLive) {
		t.Errorf("at expiry: %v", err)
	}
	c.State = Destroyed
	if err := c.CheckProof(good, now); !errors.Is(err, ErrNotLive) {
		t.Errorf("destroyed: %v", err)
	}
	if err := (&Cell{State: Ready, Generation: 1}).CheckProof(good, now); !errors.Is(err, ErrFenceMismatch) {
		t.Errorf("no lease: %v", err)
	}
}
