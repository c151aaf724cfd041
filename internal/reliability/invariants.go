package reliability

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"sync"

	_ "modernc.org/sqlite" // reads the SQLite databases of the runs
)

// DB reads a server's database directly, behind the server's back.
type DB struct{ db *sql.DB }

// OpenDB opens a sqlite:// or postgres:// database URL for reading.
func OpenDB(url string) (*DB, error) {
	var db *sql.DB
	var err error
	if path, ok := strings.CutPrefix(url, "sqlite://"); ok {
		db, err = sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	} else {
		db, err = sql.Open("postgres", url)
	}
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(2)
	return &DB{db: db}, nil
}

// Close closes the database.
func (d *DB) Close() error { return d.db.Close() }

// Installation returns the installation identity the server's migrations
// created.
func (d *DB) Installation(ctx context.Context) (string, error) {
	var id string
	err := d.db.QueryRowContext(ctx, `SELECT id FROM installation WHERE singleton = 1`).Scan(&id)
	return id, err
}

// CellRow is one row of cells.
type CellRow struct {
	ID, State, Lease, Pool string
	Generation             int
	// Image is the image the cell runs, pinned by digest ("" for a
	// pool's fixed image of a pool that names none).
	Image string
}

// MemberRow is one row of pool_members.
type MemberRow struct {
	Cell, State    string
	ProviderAbsent bool
}

// Snapshot is the state of cells, memberships and claim fences read in one
// transaction.
type Snapshot struct {
	Cells   map[string]CellRow
	Members map[string]MemberRow
	// Fences maps claim ID to lease ID ("" when durably empty).
	Fences map[string]string
	// Events is the event log, oldest first; Pruned reports that its
	// start was pruned.
	Events []EventRow
	Pruned bool
}

// EventRow is one cell or member event of the log.
type EventRow struct {
	ID                           int64
	Type, Cell, Member, From, To string
}

// ReplayViolations replays the event log and reports where it does not
// reproduce the snapshot: ids that do not increase, a change that does not
// start from the state the log last left its cell or member in, and a
// cell or member whose replayed state is not the one stored (CONTRACT §16:
// the log is written in the transaction of each change, so no crash can
// separate them).
func (s Snapshot) ReplayViolations() []string {
	var out []string
	cells, members := map[string]string{}, map[string]string{}
	var last int64
	for _, e := range s.Events {
		if e.ID <= last {
			out = append(out, fmt.Sprintf("event %d after %d", e.ID, last))
		}
		last = e.ID
		kind, _, _ := strings.Cut(e.Type, ".")
		m := cells
		key := e.Cell
		switch kind {
		case "cell":
		case "member":
			m, key = members, e.Member
		default:
			continue
		}
		if !s.Pruned && m[key] != e.From {
			out = append(out, fmt.Sprintf("event %d %s of %s goes from %q, the log left it %q", e.ID, e.Type, key, e.From, m[key]))
		}
		m[key] = e.To
	}
	if s.Pruned {
		return out
	}
	for id, c := range s.Cells {
		if cells[id] != c.State {
			out = append(out, fmt.Sprintf("cell %s is %s, the log replays %q", id, c.State, cells[id]))
		}
	}
	for id, m := range s.Members {
		if members[id] != m.State {
			out = append(out, fmt.Sprintf("member %s is %s, the log replays %q", id, m.State, members[id]))
		}
	}
	if len(cells) != len(s.Cells) || len(members) != len(s.Members) {
		out = append(out, fmt.Sprintf("the log replays %d cells and %d members, the database holds %d and %d",
			len(cells), len(members), len(s.Cells), len(s.Members)))
	}
	return out
}

// Snapshot reads the database in one read transaction.
func (d *DB) Snapshot(ctx context.Context) (Snapshot, error) {
	s := Snapshot{Cells: map[string]CellRow{}, Members: map[string]MemberRow{}, Fences: map[string]string{}}
	tx, err := d.db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true, Isolation: sql.LevelRepeatableRead})
	if err != nil {
		tx, err = d.db.BeginTx(ctx, nil)
		if err != nil {
			return s, err
		}
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT id, state, generation, COALESCE(lease_id, ''), COALESCE(pool_name, ''),
		COALESCE(image, '') FROM cells`)
	if err != nil {
		return s, err
	}
	for rows.Next() {
		var c CellRow
		if err := rows.Scan(&c.ID, &c.State, &c.Generation, &c.Lease, &c.Pool, &c.Image); err != nil {
			rows.Close()
			return s, err
		}
		s.Cells[c.ID] = c
	}
	if err := rows.Close(); err != nil {
		return s, err
	}
	rows, err = tx.QueryContext(ctx, `SELECT cell_id, state, provider_absent FROM pool_members`)
	if err != nil {
		return s, err
	}
	for rows.Next() {
		var m MemberRow
		if err := rows.Scan(&m.Cell, &m.State, &m.ProviderAbsent); err != nil {
			rows.Close()
			return s, err
		}
		s.Members[m.Cell] = m
	}
	if err := rows.Close(); err != nil {
		return s, err
	}
	rows, err = tx.QueryContext(ctx, `SELECT claim_id, COALESCE(lease_id, '') FROM claim_fences`)
	if err != nil {
		return s, err
	}
	for rows.Next() {
		var id, l string
		if err := rows.Scan(&id, &l); err != nil {
			rows.Close()
			return s, err
		}
		s.Fences[id] = l
	}
	if err := rows.Close(); err != nil {
		return s, err
	}
	var through int64
	if err := tx.QueryRowContext(ctx, `SELECT through FROM event_pruned WHERE singleton = 1`).Scan(&through); err != nil {
		return s, err
	}
	s.Pruned = through > 0
	rows, err = tx.QueryContext(ctx, `SELECT id, type, cell_id, COALESCE(member_id, ''), COALESCE(from_state, ''),
		COALESCE(to_state, '') FROM events WHERE type NOT LIKE 'lease.%' ORDER BY id`)
	if err != nil {
		return s, err
	}
	defer rows.Close()
	for rows.Next() {
		var e EventRow
		if err := rows.Scan(&e.ID, &e.Type, &e.Cell, &e.Member, &e.From, &e.To); err != nil {
			return s, err
		}
		s.Events = append(s.Events, e)
	}
	return s, rows.Err()
}

// liveMember reports whether a membership state counts against the pool's
// target (CONTRACT §4.2).
func liveMember(state string) bool {
	switch state {
	case "provisioning", "ready", "leased", "stopping", "cleanup_pending":
		return true
	}
	return false
}

// Live counts the memberships that count against the target.
func (s Snapshot) Live() int {
	n := 0
	for _, m := range s.Members {
		if liveMember(m.State) {
			n++
		}
	}
	return n
}

// Counts returns the number of memberships by state, as "state=n …".
func (s Snapshot) Counts() string {
	c := map[string]int{}
	for _, m := range s.Members {
		c[m.State]++
	}
	var parts []string
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range c {
			if !yield(k) {
				return
			}
		}
	}) {
		parts = append(parts, fmt.Sprintf("%s=%d", k, c[k]))
	}
	return strings.Join(parts, " ")
}

// History checks the invariants that relate successive snapshots and what
// clients were told. It is safe for concurrent use.
type History struct {
	Target int

	mu         sync.Mutex
	cells      map[string]CellRow // last seen
	members    map[string]string  // last seen state
	leaseCell  map[string]string  // every lease ever seen → its cell
	cellLease  map[string]string  // every cell ever leased → its lease
	snapshots  int
	maxLive    int
	violations []string
}

// NewHistory returns a History for a pool of the given target.
func NewHistory(target int) *History {
	return &History{Target: target, cells: map[string]CellRow{}, members: map[string]string{},
		leaseCell: map[string]string{}, cellLease: map[string]string{}}
}

func (h *History) violate(format string, args ...any) {
	if len(h.violations) < 50 {
		h.violations = append(h.violations, fmt.Sprintf(format, args...))
	}
}

func rank(state string) int {
	switch state {
	case "ready":
		return 0
	case "leased":
		return 1
	}
	return 2
}

// bind records that lease l is on cell c; a lease on two cells or a cell
// under two leases is a violation.
func (h *History) bind(l, c, who string) {
	if old, ok := h.leaseCell[l]; ok && old != c {
		h.violate("lease %s seen on cell %s and on cell %s (%s)", l, old, c, who)
	}
	if old, ok := h.cellLease[c]; ok && old != l {
		h.violate("cell %s leased twice: lease %s and lease %s (%s)", c, old, l, who)
	}
	h.leaseCell[l], h.cellLease[c] = c, l
}

// Claimed records a lease a client was given.
func (h *History) Claimed(leaseID, cellID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.bind(leaseID, cellID, "claim answer")
}

// Observe checks a snapshot against the ones before it: no cell goes back
// to ready or changes its lease or terminal state, no membership leaves a
// terminal state, and the live memberships never exceed the target.
func (h *History) Observe(s Snapshot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.snapshots++
	for id, c := range s.Cells {
		if prev, ok := h.cells[id]; ok {
			switch {
			case rank(c.State) < rank(prev.State):
				h.violate("cell %s went back from %s to %s", id, prev.State, c.State)
			case rank(prev.State) == 2 && c.State != prev.State:
				h.violate("terminal cell %s flipped from %s to %s", id, prev.State, c.State)
			case prev.Lease != "" && c.Lease != prev.Lease:
				h.violate("cell %s changed lease from %s to %s", id, prev.Lease, c.Lease)
			case c.Generation < prev.Generation:
				h.violate("cell %s generation went back from %d to %d", id, prev.Generation, c.Generation)
			}
		}
		if c.Lease != "" {
			h.bind(c.Lease, id, "database")
		}
		h.cells[id] = c
	}
	for id := range h.cells {
		if _, ok := s.Cells[id]; !ok {
			h.violate("cell %s disappeared", id)
		}
	}
	for id, m := range s.Members {
		if prev, ok := h.members[id]; ok && !liveMember(prev) && prev != m.State {
			h.violate("terminal member %s changed from %s to %s", id, prev, m.State)
		}
		h.members[id] = m.State
	}
	live := s.Live()
	h.maxLive = max(h.maxLive, live)
	if live > h.Target {
		h.violate("%d live members, above the target %d (%s)", live, h.Target, s.Counts())
	}
}

// Violations returns what was found so far.
func (h *History) Violations() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.violations)
}

// Stats returns the number of snapshots, the largest live count seen and
// the number of distinct leases.
func (h *History) Stats() (snapshots, maxLive, leases int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.snapshots, h.maxLive, len(h.leaseCell)
}

// CheckObjects compares a frozen snapshot (no process running) with the
// provider's objects. Always: every object belongs to a live member
// (nothing leaked), and every ready or leased member has its object. When
// settled, also: every live member has its object, and no member is
// provisioning, stopping or cleanup_pending.
func CheckObjects(s Snapshot, objects []string, settled bool) []string {
	var bad []string
	obj := map[string]bool{}
	for _, o := range objects {
		obj[o] = true
		m, ok := s.Members[o]
		switch {
		case !ok:
			bad = append(bad, "provider object "+o+" has no member (leaked)")
		case !liveMember(m.State):
			bad = append(bad, fmt.Sprintf("provider object %s belongs to a %s member (leaked)", o, m.State))
		}
	}
	for id, m := range s.Members {
		switch {
		case (m.State == "ready" || m.State == "leased") && !obj[id]:
			bad = append(bad, fmt.Sprintf("%s member %s has no provider object", m.State, id))
		case settled && liveMember(m.State) && m.State != "ready" && m.State != "leased":
			bad = append(bad, fmt.Sprintf("member %s still %s after convergence", id, m.State))
		case !liveMember(m.State) && !m.ProviderAbsent:
			bad = append(bad, fmt.Sprintf("terminal member %s (%s) without provider_absent", id, m.State))
		}
		if c, ok := s.Cells[id]; ok {
			switch {
			case m.State == "ready" && c.State != "ready",
				m.State == "leased" && c.State != "leased",
				!liveMember(m.State) && c.State != m.State:
				bad = append(bad, fmt.Sprintf("member %s is %s but its cell is %s", id, m.State, c.State))
			}
		} else if m.State != "provisioning" && m.State != "stopping" && m.State != "cleanup_pending" && m.State != "quarantined" {
			bad = append(bad, fmt.Sprintf("member %s is %s without a cell", id, m.State))
		}
	}
	return bad
}
