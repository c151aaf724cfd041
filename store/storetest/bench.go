package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// Inventory batches of BenchmarkClaim: it prepares this many ready cells
// at first, outside the timer, and twice as many at each refill, up to the
// maximum.
const (
	benchFirstBatch = 64
	benchMaxBatch   = 4096
)

// bench is the inventory of a claim benchmark: one tenant, one release.
type bench struct {
	s        store.Store
	kr       *attest.Keyring
	kata     lease.Release
	now      time.Time
	prepared atomic.Int64
}

func newBench(b *testing.B, s store.Store) *bench {
	kr, err := attest.NewKeyring([]byte(testKey))
	if err != nil {
		b.Fatal(err)
	}
	return &bench{s: s, kr: kr, kata: releaseFor(kr, releaseSetID, lease.KataMicroVM, policyDigest), now: base}
}

// prepare inserts n ready cells, using up to workers goroutines.
func (h *bench) prepare(b *testing.B, n, workers int) {
	b.Helper()
	var wg sync.WaitGroup
	var next atomic.Int64
	errs := make(chan error, workers)
	for range workers {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				i := h.prepared.Add(1)
				_, err := h.s.Prepare(context.Background(), store.PrepareParams{
					CellID:         newID(),
					TenantID:       tenantA,
					WorkerID:       workerA,
					ProviderCellID: fmt.Sprintf("bench-%d", i),
					Release:        h.kata,
					ExpiresAt:      h.now.Add(24 * time.Hour),
					Now:            h.now,
				})
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatalf("Prepare: %v", err)
	}
}

// claim makes one fenced claim with a new claim ID; it must lease a cell.
func (h *bench) claim() error {
	p := store.ClaimParams{
		TenantID:     tenantA,
		ClaimID:      newID(),
		Release:      h.kata,
		Binding:      binding1,
		LeaseSeconds: 120,
		LeaseID:      newID(),
		Now:          h.now,
		Sign: func(l lease.Lease) string {
			return attest.Digest(h.kr.LeaseToken(attest.ClaimsOf(l)))
		},
	}
	p.Digest = claimDigest(p)
	res, err := h.s.Claim(context.Background(), p)
	if err != nil {
		return fmt.Errorf("Claim: %w", err)
	}
	if res.Lease == nil {
		return errors.New("Claim leased nothing: the benchmark ran out of inventory")
	}
	return nil
}

// BenchmarkClaim measures fenced claims against s, one at a time, each with
// a new claim ID, on ready inventory that it prepares through s in batches
// outside the timer. s should be fresh; the caller closes it.
func BenchmarkClaim(b *testing.B, s store.Store) {
	h := newBench(b, s)
	left, batch := 0, benchFirstBatch
	b.ReportAllocs()
	for b.Loop() {
		if left == 0 {
			b.StopTimer()
			h.prepare(b, batch, 4)
			left, batch = batch, min(2*batch, benchMaxBatch)
			b.StartTimer()
		}
		if err := h.claim(); err != nil {
			b.Fatal(err)
		}
		left--
	}
}

// BenchmarkClaimWithoutEvents is BenchmarkClaim over s after dropEvents
// has made its cells append no events (the shipped SQL stores drop their
// cells' event triggers). Run beside BenchmarkClaim, it is what the event
// log costs a claim (CONTRACT §16 writes it in the claim's transaction);
// the benchmark's cells are unmanaged, so a claim appends one event.
func BenchmarkClaimWithoutEvents(b *testing.B, s store.Store, dropEvents func(ctx context.Context) error) {
	if err := dropEvents(b.Context()); err != nil {
		b.Fatal(err)
	}
	BenchmarkClaim(b, s)
}

// BenchmarkClaimParallel measures fenced claims against s from
// b.RunParallel goroutines, all on one inventory (tenant and release): the
// contended case, which a store must serialize. It prepares b.N ready cells
// through s before the timer starts. s should be fresh; the caller closes it.
func BenchmarkClaimParallel(b *testing.B, s store.Store) {
	h := newBench(b, s)
	h.prepare(b, b.N, 8)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := h.claim(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
