package storetest

import (
	"sync"
	"testing"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// CheckTwoStores claims through two stores over one database, a and b, as
// two processes (or replicas) would; a reader following the event log
// through one of them while both claim sees every event of both, in
// order, each once. Each store remembers candidates for
// its next claim that the other may lease first:
//   - a claims, b claims, a claims: a's second claim leases the cell after
//     b's, not b's again nor a younger one;
//   - fenced claims from both at once until the inventory is empty lease
//     every cell exactly once;
//   - identical fenced claims sent to both at once get one lease and one
//     replay.
//
// The caller closes both stores.
func CheckTwoStores(t *testing.T, a, b store.Store) {
	t.Helper()
	e := envOver(t, a)
	stores := [2]store.Store{a, b}
	claim := func(s store.Store) store.ClaimResult {
		t.Helper()
		res, err := s.Claim(t.Context(), e.claimParams(fenced(newID())))
		if err != nil {
			t.Fatalf("Claim: %v", err)
		}
		return res
	}
	var cells []lease.Cell
	for range 4 {
		cells = append(cells, e.prepare())
	}
	for i, s := range []store.Store{a, b, a} {
		if res := claim(s); res.Lease == nil || res.Lease.CellID != cells[i].ID {
			t.Fatalf("claim %d leased %+v, want cell %d (%s)", i+1, res.Lease, i+1, cells[i].ID)
		}
	}
	if res := claim(b); res.Lease == nil || res.Lease.CellID != cells[3].ID {
		t.Fatalf("claim 4 leased %+v, want the last cell %s", res.Lease, cells[3].ID)
	}

	const n = 40
	for range n {
		e.prepare()
	}
	var mu sync.Mutex
	leased := map[uuid.UUID]int{}
	var wg sync.WaitGroup
	for _, s := range stores {
		wg.Go(func() {
			for {
				res, err := s.Claim(t.Context(), e.claimParams(fenced(newID())))
				if err != nil {
					t.Errorf("Claim: %v", err)
					return
				}
				if res.Lease == nil {
					return
				}
				mu.Lock()
				leased[res.Lease.CellID]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(leased) != n {
		t.Errorf("leased %d distinct cells of %d", len(leased), n)
	}
	for id, k := range leased {
		if k != 1 {
			t.Errorf("cell %s leased %d times", id, k)
		}
	}

	const m = 20
	for range m {
		e.prepare()
	}
	for range m {
		p := e.claimParams(fenced(newID()))
		var res [2]store.ClaimResult
		var errs [2]error
		var wg sync.WaitGroup
		for i, s := range stores {
			wg.Go(func() { res[i], errs[i] = s.Claim(t.Context(), p) })
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil || res[0].Lease == nil || res[1].Lease == nil {
			t.Fatalf("identical claims: %+v %v, %+v %v", res[0], errs[0], res[1], errs[1])
		}
		if res[0].Lease.ID != res[1].Lease.ID || res[0].Replayed == res[1].Replayed {
			t.Errorf("identical claims got leases %s (replayed %t) and %s (replayed %t); want one lease, one replay",
				res[0].Lease.ID, res[0].Replayed, res[1].Lease.ID, res[1].Replayed)
		}
	}
	counts, err := b.CellCounts(t.Context())
	if err != nil || counts[lease.Leased] != 4+n+m || counts[lease.Ready] != 0 {
		t.Errorf("CellCounts = %v, %v; want %d leased, none ready", counts, err, 4+n+m)
	}

	// Claims on both stores at once while a reader follows the log
	// through a: it sees every event of both, in order, each once.
	const k = 60
	for range k {
		e.prepare()
	}
	start, err := a.LastEventID(t.Context())
	if err != nil {
		t.Fatalf("LastEventID: %v", err)
	}
	checkReader(t, t.Context(), stores[:], start, 4, func(s store.Store) bool {
		res, err := s.Claim(t.Context(), e.claimParams(fenced(newID())))
		if err != nil {
			t.Errorf("Claim: %v", err)
			return false
		}
		return res.Lease != nil
	})
}
