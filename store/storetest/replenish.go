package storetest

import (
	"errors"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

var replenishScenarios = []scenario{
	{"Replenish/Counts", testReplenishCounts},
	{"Replenish/Locked", testReplenishLocked},
	{"Replenish/Atomic", testReplenishAtomic},
	{"Replenish/BadInput", testReplenishBad},
	{"Concurrency/Replenish", testConcurrentReplenish},
}

func (e *env) replenishParams(pool string, target, maxProv int) store.ReplenishParams {
	return store.ReplenishParams{Pool: pool, TenantID: tenantA, Target: target, MaxProvisioning: maxProv,
		NewID: newID, Owner: "replica-1", LockUntil: e.now.Add(time.Minute), Now: e.now}
}

func (e *env) replenish(pool string, target, maxProv, want int) []store.Member {
	e.t.Helper()
	p := e.replenishParams(pool, target, maxProv)
	ms, err := e.s.Replenish(e.ctx, p)
	e.wantOK(err, "Replenish")
	if len(ms) != want {
		e.t.Fatalf("Replenish(target %d, max provisioning %d) created %d members, want %d", target, maxProv, len(ms), want)
	}
	for _, m := range ms {
		want := store.Member{CellID: m.CellID, Pool: pool, TenantID: tenantA, State: lease.MemberProvisioning,
			CreatedAt: e.now, UpdatedAt: e.now}
		e.wantMember(m, want, "Replenish result")
		e.wantMemberCell(m, nil, "Replenish result")
		e.wantMember(e.member(m.CellID), want, "Member after Replenish")
	}
	return ms
}

func testReplenishCounts(e *env) {
	ms := e.replenish(poolA, 3, 2, 2) // max provisioning limits
	e.replenish(poolA, 3, 2, 0)       // two provisioning already
	_, err := e.s.AdmitMember(e.ctx, e.admitParams(ms[0]))
	e.wantOK(err, "AdmitMember")
	e.replenish(poolA, 3, 2, 1) // target limits: live 2 of 3
	e.replenish(poolA, 3, 2, 0)
	// Stopping and cleanup_pending members still count.
	_, err = e.beginStop(ms[1].CellID, lease.Quarantined, lease.MemberProvisioning)
	e.wantOK(err, "BeginStop")
	e.replenish(poolA, 3, 3, 0)
	stop := e.member(ms[1].CellID)
	_, err = e.completeStop(stop, false, "timeout")
	e.wantOK(err, "CompleteStop")
	e.replenish(poolA, 3, 3, 0)
	// Leased members count too.
	e.mustLease()
	e.replenish(poolA, 3, 3, 0)
	// Only a proven stop frees the slot.
	_, err = e.completeStop(stop, true, "")
	e.wantOK(err, "CompleteStop")
	e.replenish(poolA, 3, 3, 1)
	// A target below the live count creates nothing (never negative).
	e.replenish(poolA, 1, 3, 0)
	e.replenish(poolA, 0, 0, 0)
	// Pools are counted separately.
	e.replenish(poolB, 2, 5, 2)
	want := map[string]map[lease.MemberState]int{
		poolA: {lease.MemberProvisioning: 2, lease.MemberLeased: 1, lease.MemberQuarantined: 1},
		poolB: {lease.MemberProvisioning: 2},
	}
	if mc := dropZero(e.memberCounts()); !sameCounts(mc[poolA], want[poolA]) || !sameCounts(mc[poolB], want[poolB]) {
		e.t.Errorf("MemberCounts = %v, want %v", mc, want)
	}
}

func testReplenishLocked(e *env) {
	ms := e.replenish(poolA, 1, 1, 1)
	id := ms[0].CellID
	lock := func(owner string, now time.Time, want bool, what string) {
		e.t.Helper()
		ok, err := e.s.LockMember(e.ctx, id, owner, now.Add(time.Minute), now)
		e.wantOK(err, "LockMember")
		if ok != want {
			e.t.Errorf("%s: LockMember(%s) = %v, want %v", what, owner, ok, want)
		}
	}
	lock("replica-2", e.now.Add(59*time.Second), false, "another replica before LockUntil")
	lock("replica-1", e.now.Add(time.Second), true, "the owner")
	e.wantOK(e.s.UnlockMember(e.ctx, id, "replica-1"), "UnlockMember")
	lock("replica-2", e.now.Add(2*time.Second), true, "another replica after unlock")

	// Admission ends the provisioner's lock itself, so the unlock after it
	// has nothing left to write.
	ms = e.replenish(poolA, 2, 2, 1)
	id = ms[0].CellID
	_, err := e.s.AdmitMember(e.ctx, e.admitParams(ms[0]))
	e.wantOK(err, "AdmitMember")
	lock("replica-2", e.now.Add(time.Second), true, "another replica right after the admission")
}

func testReplenishAtomic(e *env) {
	existing := e.createMember(poolA)
	calls := 0
	p := e.replenishParams(poolA, 5, 5)
	p.NewID = func() uuid.UUID {
		calls++
		if calls == 2 {
			return existing.CellID // a duplicate: the whole batch must fail
		}
		return newID()
	}
	before := e.snapshot()
	ms, err := e.s.Replenish(e.ctx, p)
	if err == nil || len(ms) != 0 {
		// A member returned with the error would be provisioned although
		// its row never committed: a leaked provider object.
		e.t.Errorf("Replenish with a duplicate cell ID = %d members, error %v; want no members and an error", len(ms), err)
	}
	e.unchanged(before, "a failed Replenish")
}

func testReplenishBad(e *env) {
	before := e.snapshot()
	for name, mutate := range map[string]func(*store.ReplenishParams){
		"empty pool":   func(p *store.ReplenishParams) { p.Pool = "" },
		"empty tenant": func(p *store.ReplenishParams) { p.TenantID = "" },
		"nil NewID":    func(p *store.ReplenishParams) { p.NewID = nil },
	} {
		p := e.replenishParams(poolA, 3, 3)
		mutate(&p)
		_, err := e.s.Replenish(e.ctx, p)
		e.wantErr(err, errcode.ErrInvalidRequest, "Replenish with "+name)
	}
	e.unchanged(before, "invalid Replenish")
}

// testConcurrentReplenish: replicas replenishing one pool at once never
// exceed its target.
func testConcurrentReplenish(e *env) {
	start := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	created := 0
	for i := range 8 {
		p := e.replenishParams(poolA, 5, 5)
		p.Owner = "replica-" + string(rune('a'+i))
		wg.Go(func() {
			<-start
			ms, err := e.s.Replenish(e.ctx, p)
			if err != nil && !errors.Is(err, errcode.ErrClaimContended) {
				e.t.Errorf("Replenish: %v", err)
			}
			mu.Lock()
			created += len(ms)
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	if mc := e.memberCounts(); created != 5 || mc[poolA][lease.MemberProvisioning] != 5 {
		e.t.Errorf("8 concurrent Replenish(target 5) created %d, MemberCounts %v; want exactly 5", created, mc)
	}
}
