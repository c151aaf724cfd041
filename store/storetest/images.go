package storetest

import (
	"strings"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// Image classes (CONTRACT §21): members made per image, cells claimable
// only by claims that name their image.
var imageScenarios = []scenario{
	{"Images/ReplenishPerImage", testImagesReplenish},
	{"Images/ClaimByImage", testImagesClaim},
	{"Images/NotPartIInventory", testImagesInventory},
}

func testImage(c byte) string {
	return "registry.test/swe/task-" + string(c) + "@sha256:" + strings.Repeat(string(c), 64)
}

// testImagesReplenish: Replenish with images makes one member per image
// listed, in order, within the pool's bounds; each member keeps its image,
// and reads back with it.
func testImagesReplenish(e *env) {
	a, b := testImage('a'), testImage('b')
	p := e.replenishParams(poolA, 3, 2)
	p.Images = []string{a, b, a}
	ms, err := e.s.Replenish(e.ctx, p)
	e.wantOK(err, "Replenish with images")
	if len(ms) != 2 || ms[0].Image != a || ms[1].Image != b {
		e.t.Fatalf("Replenish with images (max provisioning 2) = %+v, want members of %s and %s", ms, a, b)
	}
	for _, m := range ms {
		if got := e.member(m.CellID); got.Image != m.Image {
			e.t.Errorf("member %s reads back with image %q, want %q", m.CellID, got.Image, m.Image)
		}
	}
	// Fewer images than the bounds allow: as many members as images.
	p = e.replenishParams(poolB, 5, 5)
	p.Images = []string{b}
	if ms, err := e.s.Replenish(e.ctx, p); err != nil || len(ms) != 1 || ms[0].Image != b {
		e.t.Fatalf("Replenish of one image = %+v, %v; want one member of %s", ms, err, b)
	}
	// A fixed pool's members have none.
	if m := e.createMember(poolB); m.Image != "" || e.member(m.CellID).Image != "" {
		e.t.Errorf("a fixed pool's member has image %q", m.Image)
	}
}

// testImagesClaim: a claim that names an image takes the oldest ready cell
// of that image (an image class's, or a fixed pool's that pins it); a
// claim that names none never takes an image class's cell; a claim of
// another image finds nothing.
func testImagesClaim(e *env) {
	a, b, f := testImage('a'), testImage('b'), testImage('f')
	admit := func(pool, image string, fixed bool) lease.Cell {
		e.t.Helper()
		var m store.Member
		if fixed {
			m = e.createMember(pool)
		} else {
			p := e.replenishParams(pool, 100, 100)
			p.Images = []string{image}
			ms, err := e.s.Replenish(e.ctx, p)
			e.wantOK(err, "Replenish")
			m = ms[0]
		}
		ap := e.admitParams(m)
		if fixed {
			ap.Image = image
		}
		c, err := e.s.AdmitMember(e.ctx, ap)
		e.wantOK(err, "AdmitMember")
		return c
	}
	withImage := func(image string) func(*store.ClaimParams) { return func(p *store.ClaimParams) { p.Image = image } }

	a1 := admit(poolA, a, false)
	b1 := admit(poolA, b, false)
	a2 := admit(poolA, a, false)
	e.mustEmpty(fenced(newID())) // Part I never takes an image class's cell
	e.mustEmpty(withImage(f))
	if l := e.mustLease(withImage(a)); l.CellID != a1.ID {
		e.t.Errorf("a claim of %s leased %s, want the oldest cell of the image %s", a, l.CellID, a1.ID)
	}
	if l := e.mustLease(withImage(b)); l.CellID != b1.ID {
		e.t.Errorf("a claim of %s leased %s, want %s", b, l.CellID, b1.ID)
	}
	e.mustEmpty(withImage(b))

	// A fixed pool that pins f serves claims of f and Part I claims alike.
	f1 := admit(poolB, f, true)
	f2 := admit(poolB, f, true)
	if l := e.mustLease(withImage(f)); l.CellID != f1.ID {
		e.t.Errorf("a claim of %s leased %s, want the fixed pool's %s", f, l.CellID, f1.ID)
	}
	if l := e.mustLease(fenced(newID())); l.CellID != f2.ID {
		e.t.Errorf("a Part I claim leased %s, want the fixed pool's %s (never the image class's %s)", l.CellID, f2.ID, a2.ID)
	}
	if l := e.mustLease(withImage(a)); l.CellID != a2.ID {
		e.t.Errorf("a claim of %s leased %s, want %s", a, l.CellID, a2.ID)
	}
}

// testImagesInventory: the inventory and the ready count describe what a
// claim without an image can take: an image class's cells are not in them.
func testImagesInventory(e *env) {
	p := e.replenishParams(poolA, 100, 100)
	p.Images = []string{testImage('a')}
	ms, err := e.s.Replenish(e.ctx, p)
	e.wantOK(err, "Replenish")
	_, err = e.s.AdmitMember(e.ctx, e.admitParams(ms[0]))
	e.wantOK(err, "AdmitMember")
	inv, err := e.s.Inventory(e.ctx, store.InventoryParams{TenantID: tenantA, After: e.now})
	e.wantOK(err, "Inventory")
	if len(inv) != 0 {
		e.t.Errorf("Inventory with only an image class's cell = %+v, want none", inv)
	}
	n, err := e.s.CountReady(e.ctx, store.CountReadyParams{TenantID: tenantA, Release: e.kata, After: e.now})
	e.wantOK(err, "CountReady")
	if n.Ready != 0 {
		e.t.Errorf("CountReady with only an image class's cell = %+v, want 0", n)
	}
	e.poolCell(poolB)
	if n, err := e.s.CountReady(e.ctx, store.CountReadyParams{TenantID: tenantA, Release: e.kata, After: e.now}); err != nil || n.Ready != 1 {
		e.t.Errorf("CountReady with a fixed pool's cell = %+v, %v; want 1", n, err)
	}
}
