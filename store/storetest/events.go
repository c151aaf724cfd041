package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// The event log (CONTRACT §16). Besides these scenarios, every scenario of
// Run ends with verifyLog: the log, replayed, must reproduce the final
// state of every cell and membership the scenario made.

var eventScenarios = []scenario{
	{"Events/ClaimReleaseStop", testEventsClaimReleaseStop},
	{"Events/WorkerCells", testEventsWorkerCells},
	{"Events/Expiry", testEventsExpiry},
	{"Events/Filters", testEventsFilters},
	{"Events/Paging", testEventsPaging},
	{"Events/NothingOnConflict", testEventsNothingOnConflict},
	{"Events/Prune", testEventsPrune},
	{"Events/ConcurrentReader", testEventsConcurrentReader},
	{"Events/BadQuery", testEventsBadQuery},
}

// reasons are the reason codes of CONTRACT §16.
var reasons = []string{
	store.ReasonClaimed, store.ReasonReleased, store.ReasonRevoked, store.ReasonExpired, store.ReasonReadyTTL,
	store.ReasonFenceMismatch, store.ReasonRuntimeUnverified, store.ReasonImageUnverified,
	store.ReasonAgentUnverified, store.ReasonCellLost, store.ReasonDeletionProven,
	store.ReasonDeletionUncertain, store.ReasonProvisionFailed, store.ReasonWorkerDestroy,
	store.ReasonWorkerRetire, store.ReasonRenewed,
}

// allEvents reads the whole log through pages of limit.
func allEvents(ctx context.Context, s store.Store, q store.EventQuery, limit int) ([]store.Event, error) {
	var out []store.Event
	q.Limit = limit
	for {
		page, err := s.Events(ctx, q)
		if err != nil {
			return out, err
		}
		out = append(out, page...)
		if len(page) < limit {
			return out, nil
		}
		q.After = page[len(page)-1].ID
	}
}

// events reads every event of the log, member events included.
func (e *env) events() []store.Event {
	e.t.Helper()
	evs, err := allEvents(e.ctx, e.s, store.EventQuery{Members: true}, 1000)
	if err != nil {
		e.t.Fatalf("Events: %v", err)
	}
	return evs
}

// eventsAfter reads the events after id.
func (e *env) eventsAfter(after uint64) []store.Event {
	e.t.Helper()
	evs, err := allEvents(e.ctx, e.s, store.EventQuery{After: after, Members: true}, 1000)
	if err != nil {
		e.t.Fatalf("Events: %v", err)
	}
	return evs
}

func (e *env) lastEvent() uint64 {
	e.t.Helper()
	id, err := e.s.LastEventID(e.ctx)
	if err != nil {
		e.t.Fatalf("LastEventID: %v", err)
	}
	return id
}

// brief is an event as the scenarios compare it: type, subject, from, to,
// reason.
func brief(ev store.Event) string {
	return fmt.Sprintf("%s %s %s>%s %s", ev.Type, ev.CellID, ev.From, ev.To, ev.Reason)
}

func briefs(evs []store.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = brief(ev)
	}
	return out
}

// wantEvents compares the events after id with want (briefs), in order.
func (e *env) wantEvents(after uint64, want []string, what string) []store.Event {
	e.t.Helper()
	got := e.eventsAfter(after)
	if !slices.Equal(briefs(got), want) {
		e.t.Errorf("%s: events\n  %s\nwant\n  %s", what, strings.Join(briefs(got), "\n  "), strings.Join(want, "\n  "))
	}
	return got
}

func ev(typ string, id uuid.UUID, from, to, reason string) string {
	return brief(store.Event{Type: typ, CellID: id, From: from, To: to, Reason: reason})
}

// testEventsClaimReleaseStop: a pool cell's life, event by event.
func testEventsClaimReleaseStop(e *env) {
	m := e.createMember(poolA)
	mark := e.lastEvent()
	c, err := e.s.AdmitMember(e.ctx, e.admitParams(m))
	e.wantOK(err, "AdmitMember")
	id := c.ID
	l := e.mustLease()
	e.advance(time.Second)
	_, err = e.release(l, lease.Destroyed)
	e.wantOK(err, "Release")
	stop := e.member(id)
	e.advance(time.Second)
	_, err = e.completeStop(stop, true, "")
	e.wantOK(err, "CompleteStop")
	got := e.wantEvents(mark, []string{
		ev("cell.ready", id, "", "ready", ""),
		ev("member.ready", id, "provisioning", "ready", ""),
		ev("cell.leased", id, "ready", "leased", "claimed"),
		ev("member.leased", id, "ready", "leased", "claimed"),
		ev("member.stopping", id, "leased", "stopping", "released"),
		ev("lease.released", id, "", "", "released"),
		ev("cell.destroyed", id, "leased", "destroyed", "deletion_proven"),
		ev("member.destroyed", id, "stopping", "destroyed", "deletion_proven"),
	}, "a pool cell claimed, released and destroyed")
	if len(got) != 8 {
		return
	}
	for i, g := range got {
		if g.TenantID != tenantA || g.Pool != poolA {
			e.t.Errorf("event %d: tenant %q pool %q, want %q %q", i, g.TenantID, g.Pool, tenantA, poolA)
		}
	}
	for _, i := range []int{2, 3, 4, 5, 6, 7} {
		if got[i].LeaseID != l.ID {
			e.t.Errorf("event %s: lease %s, want %s", got[i].Type, got[i].LeaseID, l.ID)
		}
	}
	if got[0].Generation != 1 || got[2].Generation != 2 || got[6].Generation != 2 {
		e.t.Errorf("generations %d %d %d, want 1 2 2", got[0].Generation, got[2].Generation, got[6].Generation)
	}
	if got[1].MemberID != id || got[0].MemberID != uuid.Nil {
		e.t.Errorf("member ids %s %s, want %s on member events only", got[0].MemberID, got[1].MemberID, id)
	}
	if d := got[7]; d.Disposition != lease.Destroyed || !d.ProviderAbsent {
		e.t.Errorf("member.destroyed: disposition %q provider_absent %v, want destroyed true", d.Disposition, d.ProviderAbsent)
	}
	if d := got[4]; d.Disposition != lease.Destroyed || d.ProviderAbsent {
		e.t.Errorf("member.stopping: disposition %q provider_absent %v, want destroyed false", d.Disposition, d.ProviderAbsent)
	}
	if !got[6].At.Equal(e.now) || !got[0].At.Equal(base) {
		e.t.Errorf("times %s %s, want %s %s", got[0].At, got[6].At, base, e.now)
	}

	// A revoked pool lease whose stop cannot be proven.
	_, c2 := e.poolCell(poolA)
	mark = e.lastEvent()
	l2 := e.mustLease()
	_, err = e.revoke(tenantA, l2.ID, lease.Quarantined)
	e.wantOK(err, "Revoke")
	_, err = e.completeStop(e.member(c2.ID), false, "provider said maybe")
	e.wantOK(err, "CompleteStop")
	e.wantEvents(mark, []string{
		ev("cell.leased", c2.ID, "ready", "leased", "claimed"),
		ev("member.leased", c2.ID, "ready", "leased", "claimed"),
		ev("member.stopping", c2.ID, "leased", "stopping", "revoked"),
		ev("lease.revoked", c2.ID, "", "", "revoked"),
		ev("cell.quarantined", c2.ID, "leased", "quarantined", "deletion_uncertain"),
		ev("member.cleanup_pending", c2.ID, "stopping", "cleanup_pending", "deletion_uncertain"),
	}, "a revoked pool lease whose deletion is uncertain")

	// A stop of a ready member with a reason code.
	m3, c3 := e.poolCell(poolA)
	mark = e.lastEvent()
	_, err = e.s.BeginStop(e.ctx, store.StopIntent{CellID: m3.CellID, From: []lease.MemberState{lease.MemberReady},
		Disposition: lease.Destroyed, Reason: "ready TTL expired", EventReason: store.ReasonReadyTTL, Now: e.now})
	e.wantOK(err, "BeginStop")
	e.wantEvents(mark, []string{
		ev("cell.quarantined", c3.ID, "ready", "quarantined", "ready_ttl"),
		ev("member.stopping", c3.ID, "ready", "stopping", "ready_ttl"),
	}, "a ready member stopped for its TTL")
}

// testEventsWorkerCells: cells of an external worker.
func testEventsWorkerCells(e *env) {
	mark := e.lastEvent()
	c1 := e.prepare()
	c2 := e.prepare()
	c3 := e.prepare()
	c4 := e.prepare()
	l1 := e.mustLease()
	_, err := e.destroy(c1.ID, l1.ID, 2, lease.Destroyed)
	e.wantOK(err, "Destroy")
	l2 := e.mustLease()
	_, err = e.revoke(tenantA, l2.ID, lease.Destroyed)
	e.wantOK(err, "Revoke")
	_, err = e.retire(workerA, c4.ID, 1)
	e.wantOK(err, "Retire")
	l3 := e.mustLease()
	_, err = e.destroy(c3.ID, newID(), 2, lease.Destroyed)
	e.wantErr(err, errcode.ErrConflict, "Destroy under another lease")
	if l3.CellID != c3.ID {
		e.t.Fatalf("third lease on %s, want %s", l3.CellID, c3.ID)
	}
	e.wantEvents(mark, []string{
		ev("cell.ready", c1.ID, "", "ready", ""),
		ev("cell.ready", c2.ID, "", "ready", ""),
		ev("cell.ready", c3.ID, "", "ready", ""),
		ev("cell.ready", c4.ID, "", "ready", ""),
		ev("cell.leased", c1.ID, "ready", "leased", "claimed"),
		ev("cell.destroyed", c1.ID, "leased", "destroyed", "worker_destroy"),
		ev("cell.leased", c2.ID, "ready", "leased", "claimed"),
		ev("cell.quarantined", c2.ID, "leased", "quarantined", "revoked"),
		ev("lease.revoked", c2.ID, "", "", "revoked"),
		ev("cell.quarantined", c4.ID, "ready", "quarantined", "worker_retire"),
		ev("cell.leased", c3.ID, "ready", "leased", "claimed"),
		ev("cell.quarantined", c3.ID, "leased", "quarantined", "fence_mismatch"),
	}, "cells of an external worker")
}

// testEventsExpiry: leases found expired, and ready cells past their TTL.
func testEventsExpiry(e *env) {
	mark := e.lastEvent()
	c1 := e.prepare()
	l1 := e.mustLease(func(p *store.ClaimParams) { p.LeaseSeconds = 10 })
	// Too close to its deadline for a lease of 10 s: never claimed.
	c2 := e.prepare(func(p *store.PrepareParams) { p.ExpiresAt = e.now.Add(5 * time.Second) })
	m, c3 := e.poolCell(poolA)
	l3 := e.mustLease(func(p *store.ClaimParams) { p.LeaseSeconds = 10 })
	if l1.CellID != c1.ID || l3.CellID != c3.ID {
		e.t.Fatalf("leased %s and %s, want %s and %s", l1.CellID, l3.CellID, c1.ID, c3.ID)
	}
	e.advance(time.Minute)
	_, err := e.s.CheckLease(e.ctx, e.check(l3))
	e.wantErr(err, errcode.ErrConflict, "CheckLease of an expired lease")
	n, err := e.s.ExpireUnmanaged(e.ctx, e.now)
	e.wantOK(err, "ExpireUnmanaged")
	if n != 2 {
		e.t.Errorf("ExpireUnmanaged changed %d cells, want 2", n)
	}
	got := e.eventsAfter(mark)
	want := []string{
		ev("cell.ready", c1.ID, "", "ready", ""),
		ev("cell.leased", c1.ID, "ready", "leased", "claimed"),
		ev("cell.ready", c2.ID, "", "ready", ""),
		ev("member.provisioning", m.CellID, "", "provisioning", ""),
		ev("cell.ready", c3.ID, "", "ready", ""),
		ev("member.ready", c3.ID, "provisioning", "ready", ""),
		ev("cell.leased", c3.ID, "ready", "leased", "claimed"),
		ev("member.leased", c3.ID, "ready", "leased", "claimed"),
		ev("cell.quarantined", c3.ID, "leased", "quarantined", "expired"),
		ev("lease.expired", c3.ID, "", "", "expired"),
		ev("cell.quarantined", c1.ID, "leased", "quarantined", "expired"),
		ev("lease.expired", c1.ID, "", "", "expired"),
		ev("cell.quarantined", c2.ID, "ready", "quarantined", "ready_ttl"),
	}
	if !slices.Equal(briefs(got), want) {
		e.t.Errorf("expiry events\n  %s\nwant\n  %s", strings.Join(briefs(got), "\n  "), strings.Join(want, "\n  "))
	}
}

// testEventsFilters: tenant, member, type, pool and lease filters.
func testEventsFilters(e *env) {
	_, pc := e.poolCell(poolA)
	_, pb := e.poolCell(poolB)
	l := e.mustLease()
	other := e.prepare(func(p *store.PrepareParams) { p.TenantID = tenantB })
	all := e.events()
	check := func(q store.EventQuery, keep func(store.Event) bool, what string) {
		e.t.Helper()
		got, err := allEvents(e.ctx, e.s, q, 2)
		if err != nil {
			e.t.Fatalf("%s: Events: %v", what, err)
		}
		var want []store.Event
		for _, ev := range all {
			if keep(ev) {
				want = append(want, ev)
			}
		}
		if !slices.Equal(briefs(got), briefs(want)) || len(want) == 0 {
			e.t.Errorf("%s: events\n  %s\nwant (non-empty)\n  %s", what, strings.Join(briefs(got), "\n  "), strings.Join(briefs(want), "\n  "))
		}
	}
	isMember := func(ev store.Event) bool { return strings.HasPrefix(ev.Type, "member.") }
	check(store.EventQuery{TenantID: tenantA}, func(ev store.Event) bool { return ev.TenantID == tenantA && !isMember(ev) },
		"tenant A without members")
	check(store.EventQuery{TenantID: tenantA, Members: true}, func(ev store.Event) bool { return ev.TenantID == tenantA },
		"tenant A with members")
	check(store.EventQuery{TenantID: tenantB}, func(ev store.Event) bool { return ev.CellID == other.ID }, "tenant B")
	check(store.EventQuery{Members: true, TypePrefix: "member."}, isMember, "type member.")
	check(store.EventQuery{TypePrefix: "cell.leased"}, func(ev store.Event) bool { return ev.Type == "cell.leased" }, "type cell.leased")
	check(store.EventQuery{Members: true, Pool: poolB}, func(ev store.Event) bool { return ev.CellID == pb.ID }, "pool B")
	check(store.EventQuery{Members: true, LeaseID: l.ID}, func(ev store.Event) bool { return ev.LeaseID == l.ID && ev.CellID == pc.ID },
		"one lease")
}

// testEventsPaging: pages end where the next begins; ids increase.
func testEventsPaging(e *env) {
	for range 5 {
		e.prepare()
		e.mustLease()
	}
	all := e.events()
	if len(all) != 10 {
		e.t.Fatalf("%d events, want 10", len(all))
	}
	for i := 1; i < len(all); i++ {
		if all[i].ID <= all[i-1].ID {
			e.t.Fatalf("event ids %d then %d: not increasing", all[i-1].ID, all[i].ID)
		}
	}
	if last := e.lastEvent(); last != all[len(all)-1].ID {
		e.t.Errorf("LastEventID = %d, want %d", last, all[len(all)-1].ID)
	}
	for _, limit := range []int{1, 3, 10, 11} {
		got, err := allEvents(e.ctx, e.s, store.EventQuery{Members: true}, limit)
		e.wantOK(err, "Events")
		if !slices.EqualFunc(got, all, func(a, b store.Event) bool { return a.ID == b.ID }) {
			e.t.Errorf("pages of %d read %d events, want the %d of one read", limit, len(got), len(all))
		}
	}
	if got := e.eventsAfter(all[len(all)-1].ID); len(got) != 0 {
		e.t.Errorf("events after the last: %d, want none", len(got))
	}
	if got := e.eventsAfter(all[len(all)-1].ID + 1000); len(got) != 0 {
		e.t.Errorf("events after an id not yet handed out: %d, want none", len(got))
	}
}

// testEventsNothingOnConflict: a refused change appends nothing.
func testEventsNothingOnConflict(e *env) {
	m, _ := e.poolCell(poolA)
	c := e.prepare()
	mark := e.lastEvent()
	_, err := e.s.AdmitMember(e.ctx, e.admitParams(m))
	e.wantErr(err, errcode.ErrConflict, "AdmitMember twice")
	_, err = e.s.Prepare(e.ctx, e.prepareParams(func(p *store.PrepareParams) { p.CellID = c.ID }))
	e.wantErr(err, errcode.ErrConflict, "Prepare of a used cell ID")
	_, err = e.retire(workerA, c.ID, 2)
	e.wantErr(err, errcode.ErrConflict, "Retire of the wrong generation")
	_, err = e.beginStop(m.CellID, lease.Destroyed, lease.MemberLeased)
	e.wantErr(err, errcode.ErrConflict, "BeginStop from the wrong state")
	ok, err := e.s.LockMember(e.ctx, m.CellID, "owner", e.now.Add(time.Minute), e.now)
	if err != nil || !ok {
		e.t.Fatalf("LockMember = %v, %v", ok, err)
	}
	e.wantOK(e.s.RecordVerification(e.ctx, store.VerificationParams{CellID: m.CellID, Now: e.now}), "RecordVerification")
	if got := e.eventsAfter(mark); len(got) != 0 {
		e.t.Errorf("refused changes and lock or verification writes appended %v", briefs(got))
	}
}

// testEventsPrune: pruning deletes a prefix, keeps the newest event, marks
// what it removed, and ids are never handed out again.
func testEventsPrune(e *env) {
	for range 3 {
		e.prepare()
	}
	e.advance(time.Hour)
	young := e.prepare()
	all := e.events()
	n, err := e.s.PruneEvents(e.ctx, e.now.Add(-time.Minute))
	e.wantOK(err, "PruneEvents")
	if n != 3 {
		e.t.Errorf("PruneEvents deleted %d, want 3", n)
	}
	_, err = e.s.Events(e.ctx, store.EventQuery{Limit: 10})
	e.wantErr(err, errcode.ErrEventsExpired, "Events from the start of a pruned log")
	got, err := e.s.Events(e.ctx, store.EventQuery{Oldest: true, Members: true, Limit: 10})
	e.wantOK(err, "Events from the oldest retained")
	if len(got) != 1 || got[0].CellID != young.ID {
		e.t.Fatalf("after pruning: %v, want only the young cell's event", briefs(got))
	}
	_, err = e.s.Events(e.ctx, store.EventQuery{After: all[1].ID, Limit: 10})
	e.wantErr(err, errcode.ErrEventsExpired, "Events after a pruned id")
	if _, err := e.s.Events(e.ctx, store.EventQuery{After: all[2].ID, Limit: 10}); err != nil {
		e.t.Errorf("Events after the last pruned id: %v, want the rest", err)
	}

	// Everything old: the newest event stays, so ids go on increasing.
	e.advance(time.Hour)
	n, err = e.s.PruneEvents(e.ctx, e.now)
	e.wantOK(err, "PruneEvents")
	if n != 0 {
		e.t.Errorf("PruneEvents of a log of one deleted %d, want 0", n)
	}
	c := e.prepare()
	got = e.eventsAfter(all[3].ID)
	if len(got) != 1 || got[0].CellID != c.ID || got[0].ID <= all[3].ID {
		e.t.Errorf("event after pruning: %+v, want one for %s with an id above %d", got, c.ID, all[3].ID)
	}
	n, err = e.s.PruneEvents(e.ctx, e.now.Add(time.Second))
	e.wantOK(err, "PruneEvents")
	if n != 1 {
		e.t.Errorf("PruneEvents deleted %d, want 1 (all but the newest)", n)
	}
	e.prepare()
	last := e.eventsAfter(all[3].ID)
	if len(last) != 2 || last[1].ID <= got[0].ID {
		e.t.Errorf("log after pruning twice: %+v", last)
	}
}

// testEventsConcurrentReader: claims on many goroutines while a reader
// follows the log. Every page the reader reads continues the log: it never
// sees an id and later one below it, and at the end it has seen every
// event, each once — no id it passed was still in flight.
func testEventsConcurrentReader(e *env) {
	const cells, workers = 60, 8
	for range cells {
		e.prepare()
	}
	start := e.lastEvent()
	checkReader(e.t, e.ctx, []store.Store{e.s}, start, workers, func(s store.Store) bool {
		res, err := s.Claim(e.ctx, e.claimParams(fenced(newID())))
		if err != nil {
			e.t.Errorf("Claim: %v", err)
			return false
		}
		return res.Lease != nil
	})
}

// checkReader runs claim on workers goroutines per store until each reports
// false, while a reader follows the log from after through the first
// store, then checks what the reader saw against the whole log.
func checkReader(t *testing.T, ctx context.Context, stores []store.Store, after uint64, workers int, claim func(store.Store) bool) {
	t.Helper()
	done := make(chan struct{})
	var seen []uint64
	readErr := make(chan error, 1)
	go func() {
		defer close(readErr)
		cur := after
		for {
			select {
			case <-done:
				// One last read after every claim returned.
				page, err := allEvents(ctx, stores[0], store.EventQuery{After: cur, Members: true}, 7)
				for _, ev := range page {
					seen = append(seen, ev.ID)
				}
				readErr <- err
				return
			default:
			}
			time.Sleep(time.Millisecond)
			page, err := stores[0].Events(ctx, store.EventQuery{After: cur, Members: true, Limit: 7})
			if err != nil {
				readErr <- err
				return
			}
			for _, ev := range page {
				if ev.ID <= cur {
					readErr <- fmt.Errorf("read id %d after %d", ev.ID, cur)
					return
				}
				seen = append(seen, ev.ID)
				cur = ev.ID
			}
		}
	}()
	var wg sync.WaitGroup
	for _, s := range stores {
		for range workers {
			wg.Go(func() {
				for claim(s) {
				}
			})
		}
	}
	wg.Wait()
	close(done)
	if err := <-readErr; err != nil {
		t.Fatalf("reader: %v", err)
	}
	all, err := allEvents(ctx, stores[len(stores)-1], store.EventQuery{After: after, Members: true}, 1000)
	if err != nil {
		t.Fatalf("Events: %v", err)
	}
	ids := make([]uint64, len(all))
	for i, ev := range all {
		ids[i] = ev.ID
	}
	if len(ids) == 0 {
		t.Fatal("the claims appended no event")
	}
	if !slices.Equal(seen, ids) {
		t.Fatalf("the reader, following the log, saw %d events, the log holds %d: a reader passed an id still in flight\nseen %v\nlog  %v",
			len(seen), len(ids), seen, ids)
	}
}

// testEventsBadQuery: a query without a limit is refused.
func testEventsBadQuery(e *env) {
	_, err := e.s.Events(e.ctx, store.EventQuery{})
	e.wantErr(err, errcode.ErrInvalidRequest, "Events without a limit")
}

// verifyLog replays the log and compares it with the final states read
// at the end of a scenario: every cell and member the scenario made has
// a history in it that starts where a cell or member starts, continues
// each change from the state the last one left, and ends in the state
// read; ids increase; reasons are codes.
func (k *tracker) verifyLog(ctx context.Context, cells map[uuid.UUID]lease.State, members map[uuid.UUID]lease.MemberState) {
	k.t.Helper()
	evs, err := allEvents(ctx, k.Store, store.EventQuery{Members: true}, 1000)
	if errors.Is(err, errcode.ErrEventsExpired) {
		return // a scenario that prunes its log
	}
	if err != nil {
		k.fail("event log: %v", err)
		return
	}
	if len(evs) > 0 && evs[0].ID > 1 {
		return // pruned: the history is incomplete by design
	}
	cellState := map[uuid.UUID]string{}
	memberState := map[uuid.UUID]string{}
	var last uint64
	for _, ev := range evs {
		if ev.ID <= last {
			k.fail("event log: id %d after %d", ev.ID, last)
		}
		last = ev.ID
		if ev.Reason != "" && !slices.Contains(reasons, ev.Reason) {
			k.fail("event log: event %d has reason %q, not a code", ev.ID, ev.Reason)
		}
		kind, to, _ := strings.Cut(ev.Type, ".")
		switch kind {
		case "cell":
			if ev.To != to || cellState[ev.CellID] != ev.From {
				k.fail("event log: event %d %s of cell %s goes %q→%q, replay has it %q", ev.ID, ev.Type, ev.CellID, ev.From, ev.To, cellState[ev.CellID])
			}
			cellState[ev.CellID] = to
		case "member":
			if ev.To != to || memberState[ev.MemberID] != ev.From || ev.MemberID != ev.CellID {
				k.fail("event log: event %d %s of member %s goes %q→%q, replay has it %q", ev.ID, ev.Type, ev.MemberID, ev.From, ev.To, memberState[ev.MemberID])
			}
			memberState[ev.MemberID] = to
		case "lease":
			if !slices.Contains([]string{"released", "revoked", "expired", "renewed"}, to) || ev.LeaseID == uuid.Nil {
				k.fail("event log: event %d is %s of lease %s", ev.ID, ev.Type, ev.LeaseID)
			}
			if to == "renewed" && cellState[ev.CellID] != string(lease.Leased) {
				k.fail("event log: event %d renews lease %s of cell %s, which replay has %q", ev.ID, ev.LeaseID, ev.CellID, cellState[ev.CellID])
			}
		default:
			k.fail("event log: event %d has type %q", ev.ID, ev.Type)
		}
	}
	for id, st := range cells {
		if got := cellState[id]; got != string(st) {
			k.fail("event log: replay leaves cell %s %q, the store has it %q", id, got, st)
		}
	}
	for id, st := range members {
		if got := memberState[id]; got != string(st) {
			k.fail("event log: replay leaves member %s %q, the store has it %q", id, got, st)
		}
	}
	if len(cellState) != len(cells) || len(memberState) != len(members) {
		k.fail("event log: replay has %d cells and %d members, the scenario made %d and %d",
			len(cellState), len(memberState), len(cells), len(members))
	}
}
