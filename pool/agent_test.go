package pool_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
)

// noDigest is an agent provider whose read-back reports no agent in its
// objects.
type noDigest struct{ *fake.AgentProvider }

func (p noDigest) Inspect(ctx context.Context, obj driver.Object) (driver.Observation, error) {
	obs, err := p.AgentProvider.Inspect(ctx, obj)
	obs.AgentDigest = ""
	return obs, err
}

// members returns every member of the pool, whatever its state.
func (f *fixture) members() []store.Member {
	f.t.Helper()
	ms, err := f.st.Members(f.ctx, "p1", lease.MemberStates...)
	if err != nil {
		f.t.Fatal(err)
	}
	return ms
}

// wantStopReason checks that the cell's stop was logged with a reason
// containing reason.
func (f *fixture) wantStopReason(cellID uuid.UUID, reason string) {
	f.t.Helper()
	for _, line := range strings.Split(f.logs.String(), "\n") {
		if strings.Contains(line, "cell stopping") && strings.Contains(line, cellID.String()) && strings.Contains(line, reason) {
			return
		}
	}
	f.t.Fatalf("no stop of %s logged with reason %q:\n%s", cellID, reason, f.logs.String())
}

// TestAdmissionReadsAgentEvidence: a cell is admitted only when its agent
// reports waiting, no activation, its own cell and the build the provider
// mounted; otherwise the member is quarantined with cell_agent_unverified
// and its object proven deleted, and no claim ever sees the cell.
func TestAdmissionReadsAgentEvidence(t *testing.T) {
	for _, tc := range []struct {
		name            string
		status          func(agent.Status) agent.Status
		inspectNoDigest bool
	}{
		{name: "active", status: func(s agent.Status) agent.Status { s.State = agent.Active; return s }},
		{name: "ended", status: func(s agent.Status) agent.Status { s.State = agent.Ended; return s }},
		{name: "activated once", status: func(s agent.Status) agent.Status { s.Activations = 1; return s }},
		{name: "another cell", status: func(s agent.Status) agent.Status { s.CellID = uuid.NewString(); return s }},
		{name: "wrong digest", status: func(s agent.Status) agent.Status { s.Digest = "sha256:" + strings.Repeat("0", 64); return s }},
		{name: "no digest", status: func(s agent.Status) agent.Status { s.Digest = ""; return s }},
		{name: "provider reports no agent", inspectNoDigest: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ap := fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"})
			ap.SetAgentFaults(fake.AgentFaults{Status: tc.status})
			var prov driver.Provider = ap
			if tc.inspectNoDigest {
				prov = noDigest{ap}
			}
			f := newFixture(t, pool.Config{Target: 1, Provider: prov})
			f.pools.Pass(f.ctx)
			ms := f.members()
			if len(ms) != 1 || ms[0].State != lease.MemberQuarantined || !ms[0].ProviderAbsent {
				t.Fatalf("members after admission: %+v", ms)
			}
			f.wantStopReason(ms[0].CellID, "provision failed: cell_agent_unverified: ")
			if c := ms[0].Cell; c != nil && c.State != lease.Quarantined {
				t.Fatalf("cell: %+v", c)
			}
			if res := f.claim(); res.Lease != nil {
				t.Fatalf("claimed a cell whose agent was unverified: %v", res)
			}
			if f.prov.Len() != 0 {
				t.Fatalf("%d provider objects left", f.prov.Len())
			}
		})
	}
}

// TestVerificationReadsAgentEvidence: a ready cell's agent is read again
// at every periodic verification; one that no longer reports waiting ends
// the cell. The agent's status is never read inside a claim.
func TestVerificationReadsAgentEvidence(t *testing.T) {
	ap := fake.NewWithAgent(fake.Config{Mode: driver.Apply, Kind: "fake"})
	f := newFixture(t, pool.Config{Target: 1, Provider: ap})
	f.pools.Pass(f.ctx)
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 1})
	statuses := func() int {
		n := 0
		for _, m := range ap.Received() {
			if m.Op == "status" {
				n++
			}
		}
		return n
	}
	if n := statuses(); n != 1 {
		t.Fatalf("%d status reads at admission, want 1", n)
	}
	first := f.members()[0].CellID
	f.clock.Advance(2 * time.Second)
	f.pools.Pass(f.ctx)
	f.wantCounts(map[lease.MemberState]int{lease.MemberReady: 1})
	if n := statuses(); n != 2 {
		t.Fatalf("%d status reads after a verification, want 2", n)
	}

	ap.SetAgentFaults(fake.AgentFaults{Status: func(s agent.Status) agent.Status { s.State = agent.Active; return s }})
	if res := f.claim(); res.Lease == nil {
		t.Fatal("no cell claimed")
	} else if n := statuses(); n != 2 {
		t.Fatalf("the claim read the agent's status (%d reads)", n)
	}
	ap.SetAgentFaults(fake.AgentFaults{})

	// A second ready cell whose agent turns out active at its next
	// verification is quarantined.
	f.pools.SetTarget("p1", 2)
	f.pools.Pass(f.ctx)
	var second uuid.UUID
	for _, m := range f.members() {
		if m.State == lease.MemberReady {
			second = m.CellID
		}
	}
	if second == uuid.Nil || second == first {
		t.Fatalf("members: %+v", f.members())
	}
	ap.SetAgentFaults(fake.AgentFaults{Status: func(s agent.Status) agent.Status { s.State = agent.Active; return s }})
	f.clock.Advance(2 * time.Second)
	f.pools.Pass(f.ctx)
	m, err := f.st.Member(f.ctx, second)
	if err != nil || m.State != lease.MemberQuarantined || !m.ProviderAbsent {
		t.Fatalf("member after its agent turned active: %+v %v", m, err)
	}
	f.wantStopReason(second, `"cell_agent_unverified: the agent is \"active\", not waiting"`)
	if m, _ := f.st.Member(f.ctx, first); m.State != lease.MemberLeased {
		t.Fatalf("the leased member was touched: %+v", m)
	}
}
