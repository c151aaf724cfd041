package sandboxwich_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// TestFollow: Follow yields the events already in the log, then those
// appended while following, in commit order; resuming after an id yields
// the rest; ending ctx ends the sequence without an error; and a position
// older than the retention kept yields errcode.ErrEventsExpired.
func TestFollow(t *testing.T) {
	e := newEnv(t, sandboxwich.WithEventRetention(time.Minute))
	filter := sandboxwich.EventQuery{TenantID: "acme"}
	var cells []uuid.UUID
	for range 2 {
		cells = append(cells, e.prepare(t).ID)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	type item struct {
		ev  sandboxwich.Event
		err error
	}
	ch := make(chan item)
	go func() {
		defer close(ch)
		for ev, err := range e.plane.Follow(ctx, 0, filter) {
			ch <- item{ev, err}
		}
	}()
	var ids []uint64
	next := func() sandboxwich.Event {
		t.Helper()
		select {
		case it, ok := <-ch:
			if !ok || it.err != nil {
				t.Fatalf("Follow ended: %v", it.err)
			}
			return it.ev
		case <-time.After(10 * time.Second):
			t.Fatal("Follow yielded nothing in 10 s")
		}
		return sandboxwich.Event{}
	}
	for i := range 4 {
		if i == 2 { // appended while following
			for range 2 {
				cells = append(cells, e.prepare(t).ID)
			}
		}
		ev := next()
		if ev.CellID != cells[i] || ev.TenantID != "acme" || (i > 0 && ev.ID <= ids[i-1]) {
			t.Fatalf("event %d: %+v, want cell %s after id %v", i, ev, cells[i], ids)
		}
		ids = append(ids, ev.ID)
	}
	cancel()
	for it := range ch {
		if it.err != nil {
			t.Fatalf("after cancel: %v, want the sequence to end", it.err)
		}
	}

	var resumed []uint64
	for ev, err := range e.plane.Follow(e.ctx, ids[1], filter) {
		if err != nil {
			t.Fatal(err)
		}
		if resumed = append(resumed, ev.ID); len(resumed) == 2 {
			break
		}
	}
	if fmt.Sprint(resumed) != fmt.Sprint(ids[2:]) {
		t.Fatalf("resumed after %d: %v, want %v", ids[1], resumed, ids[2:])
	}

	e.now = e.now.Add(time.Hour)
	e.prepare(t)
	if n, err := e.plane.PruneEvents(e.ctx); err != nil || n < 4 {
		t.Fatalf("prune: %d, %v", n, err)
	}
	for _, err := range e.plane.Follow(e.ctx, ids[0], filter) {
		if !errors.Is(err, errcode.ErrEventsExpired) {
			t.Fatalf("following a pruned position: %v, want ErrEventsExpired", err)
		}
		break
	}
}

// This example follows the event log in process: the events of a tenant,
// in commit order, as they are committed.
func ExamplePlane_Follow() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, _ := os.MkdirTemp("", "sandboxwich-example")
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "cells.db"), sqlite.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	keys, _ := attest.NewKeyring([]byte("sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"))
	plane, err := sandboxwich.New(st, keys)
	if err != nil {
		log.Fatal(err)
	}
	rel := lease.Release{ReleaseSetID: "release-set-2026-08-07", RuntimeClass: lease.GVisorLowerRisk,
		PolicyDigest: "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"}
	rel.Signature = keys.SignRelease(rel)
	worker := sandboxwich.Worker{ID: uuid.New(), TenantID: "acme", RuntimeClasses: []lease.RuntimeClass{lease.GVisorLowerRisk}}

	// Follow from the log's current end (0 would replay what it holds).
	head, _ := plane.LastEventID(ctx)
	go func() {
		_, _ = plane.Prepare(ctx, worker, sandboxwich.PrepareRequest{CellID: uuid.New(), Release: rel,
			ProviderCellID: "sandbox-17", ExpiresAt: time.Now().Add(time.Hour)})
	}()
	for ev, err := range plane.Follow(ctx, head, sandboxwich.EventQuery{TenantID: "acme"}) {
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println(ev.Type, ev.To, ev.Generation)
		break // or resume later after ev.ID
	}
	// Output:
	// cell.ready ready 1
}
