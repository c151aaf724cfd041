package storetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// recorder collects what the tracker reports.
type recorder struct{ errs []string }

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestTrackerCatches feeds the tracker histories that break an invariant,
// and one that does not: the suite's invariant checks can fail.
func TestTrackerCatches(t *testing.T) {
	id, other := uuid.New(), uuid.New()
	ready := lease.Cell{ID: id, WorkerID: "w", State: lease.Ready, Generation: 1, ExpiresAt: base}
	l := lease.Lease{ID: uuid.New(), CellID: id, Generation: 2, ExpiresAt: base.Add(time.Minute)}
	leased := leasedCell(ready, l)
	l2 := l
	l2.ID = uuid.New()
	otherLease := leased
	otherLease.Lease = &l2
	stolen := leased
	stolen.ID = other
	stolenLease := l
	stolenLease.CellID = other
	stolen.Lease = &stolenLease
	member := store.Member{CellID: id, Pool: "p", State: lease.MemberStopping, RequestedDisposition: lease.Destroyed, StopGeneration: 1}
	redisposed := member
	redisposed.RequestedDisposition = lease.Quarantined
	absent := member
	absent.State, absent.ProviderAbsent = lease.MemberDestroyed, true
	lost := absent
	lost.ProviderAbsent = false

	for _, tc := range []struct {
		name  string
		cells []lease.Cell
		ms    []store.Member
		want  string // "" for no report
	}{
		{"valid life", []lease.Cell{ready, leased, withState(leased, lease.Destroyed)}, nil, ""},
		{"back to ready", []lease.Cell{ready, withState(ready, lease.Quarantined), ready}, nil, "reads ready again"},
		{"terminal flip", []lease.Cell{leased, withState(leased, lease.Quarantined), withState(leased, lease.Destroyed)}, nil, "terminal cell"},
		{"ready with lease", []lease.Cell{withState(leased, lease.Ready)}, nil, "ready cell is not generation 1"},
		{"leased without lease", []lease.Cell{withState(ready, lease.Leased)}, nil, "leased cell is not generation 2"},
		{"lease changed", []lease.Cell{leased, otherLease}, nil, "lease changed"},
		{"lease on two cells", []lease.Cell{leased, stolen}, nil, "is on cells"},
		{"generation back", []lease.Cell{withState(leased, lease.Quarantined), withState(ready, lease.Quarantined)}, nil, "generation went back"},
		{"valid stop", nil, []store.Member{member, absent}, ""},
		{"disposition changed", nil, []store.Member{member, redisposed}, "stop changed"},
		{"terminal member moved", nil, []store.Member{absent, member}, "terminal member"},
		{"provider_absent lost", nil, []store.Member{absent, lost}, "lost provider_absent"},
		{"absent while live", nil, []store.Member{{CellID: id, State: lease.MemberStopping, ProviderAbsent: true, RequestedDisposition: lease.Destroyed}}, "with provider_absent"},
	} {
		r := &recorder{}
		k := newTracker(r, nil)
		for _, c := range tc.cells {
			k.observeCell("test", c)
		}
		for _, m := range tc.ms {
			k.observeMember("test", m)
		}
		got := strings.Join(r.errs, "\n")
		if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
			t.Errorf("%s: tracker reported %q, want %q", tc.name, got, tc.want)
		}
	}
}
