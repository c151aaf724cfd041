// Package inflight keeps a driver's creating requests from being abandoned
// mid-flight.
//
// A create whose caller gives up (its context is cancelled or its deadline
// passes) can still land on the provider: the request reached the server,
// and the server finishes it after the client hung up. A Destroy that reads
// the name absent in that window would prove a deletion that the late
// create then undoes, and the object would hold capacity nobody accounts
// for. So a creating call runs to completion on a context of its own, the
// caller returns as soon as its context ends, and Destroy of the same cell
// first waits for every such call of that cell to have returned.
package inflight

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
)

// Timeout bounds a creating call that its caller abandoned.
const Timeout = 30 * time.Second

// Set tracks the creating calls in flight, by cell. The zero value is ready
// to use; a Set must not be copied after first use.
type Set struct {
	mu    sync.Mutex
	cells map[uuid.UUID]*calls
}

type calls struct {
	n    int
	idle chan struct{} // closed when n drops to zero
}

// Do runs call for cell on a context that ctx's cancellation does not end
// (it keeps ctx's values and is bounded by Timeout) and returns its error,
// or ctx's error as soon as ctx ends first, in which case call goes on in
// the background until it returns.
func (s *Set) Do(ctx context.Context, cell uuid.UUID, call func(context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.cells == nil {
		s.cells = map[uuid.UUID]*calls{}
	}
	c := s.cells[cell]
	if c == nil {
		c = &calls{idle: make(chan struct{})}
		s.cells[cell] = c
	}
	c.n++
	s.mu.Unlock()

	done := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), Timeout)
		defer cancel()
		err := call(cctx)
		s.mu.Lock()
		if c.n--; c.n == 0 {
			close(c.idle)
			delete(s.cells, cell)
		}
		s.mu.Unlock()
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Wait returns once no call Do started for cell is in flight, or with an
// error when ctx ends first.
func (s *Set) Wait(ctx context.Context, cell uuid.UUID) error {
	s.mu.Lock()
	c := s.cells[cell]
	s.mu.Unlock()
	if c == nil {
		return nil
	}
	select {
	case <-c.idle:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("a create of cell %s is still in flight: %w", cell, ctx.Err())
	}
}
