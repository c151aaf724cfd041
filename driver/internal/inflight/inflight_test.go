package inflight

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"
)

// An abandoned call goes on with a live context, and Wait holds Destroy
// until it has returned.
func TestAbandonedCallIsWaitedOut(t *testing.T) {
	var s Set
	cell := uuid.New()
	release := make(chan struct{})
	finished := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	err := s.Do(ctx, cell, func(cctx context.Context) error {
		cancel() // the caller gives up while the call is in flight
		<-release
		finished <- cctx.Err() // the call's own context outlives the caller's
		return nil
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Do after its caller gave up = %v, want context.Canceled", err)
	}

	short, stop := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer stop()
	if err := s.Wait(short, cell); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait with the call in flight = %v, want DeadlineExceeded", err)
	}
	if err := s.Wait(context.Background(), uuid.New()); err != nil {
		t.Fatalf("Wait for a cell with nothing in flight = %v", err)
	}

	close(release)
	if err := s.Wait(context.Background(), cell); err != nil {
		t.Fatalf("Wait after the call returned = %v", err)
	}
	if err := <-finished; err != nil {
		t.Fatalf("the abandoned call's context ended: %v", err)
	}
	s.mu.Lock()
	n := len(s.cells)
	s.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d cells still tracked after every call returned", n)
	}
}

// A call that finishes in time returns its own error, and an already ended
// context runs nothing.
func TestDoReturnsTheCallsError(t *testing.T) {
	var s Set
	cell := uuid.New()
	boom := errors.New("boom")
	if err := s.Do(context.Background(), cell, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want the call's error", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := false
	if err := s.Do(ctx, cell, func(context.Context) error { ran = true; return nil }); !errors.Is(err, context.Canceled) || ran {
		t.Fatalf("Do with an ended context = %v (ran %v), want context.Canceled and nothing run", err, ran)
	}
}
