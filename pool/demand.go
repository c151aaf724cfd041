package pool

import (
	"cmp"
	"slices"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// imageDemand is what a reconciler knows of the demand for one image of
// an image class (CONTRACT §21): the claims of this process waiting for a
// cell of it, since when the oldest of them waits, when it was last
// claimed or waited for (which keeps it warm for WarmIdle), and the most
// of its cells in use at once — leased, or waited for — lately (peak,
// last reached or renewed at peakAt; it decays after WarmIdle).
type imageDemand struct {
	waiting int
	since   time.Time
	last    time.Time
	peak    int
	peakAt  time.Time
}

// Want records that a claim of this process waits for a cell of image
// (canonical, CanonicalImage) in the image class pool: until done is
// called, the pool keeps a cell of it provisioning or ready for the claim,
// within its max_cells and max_cold, evicting ready cells of images no
// claim waits for when it is full. Waits of different images are served
// in the order they began. Want on a fixed pool, or an unknown one, does
// nothing.
func (r *Reconciler) Want(pool, image string) (done func()) {
	d := r.demand(pool, image)
	if d == nil {
		return func() {}
	}
	r.mu.Lock()
	now := r.opt.Now()
	if d.waiting == 0 {
		d.since = now
	}
	d.waiting++
	d.last = now
	r.mu.Unlock()
	r.Trigger()
	return func() {
		r.mu.Lock()
		d.waiting--
		d.last = r.opt.Now()
		r.mu.Unlock()
	}
}

// Claimed records that a claim named image in the image class pool: the
// image stays warm (Config.WarmPerImage ready cells) for Config.WarmIdle.
func (r *Reconciler) Claimed(pool, image string) {
	d := r.demand(pool, image)
	if d == nil {
		return
	}
	r.mu.Lock()
	d.last = r.opt.Now()
	r.mu.Unlock()
	r.Trigger()
}

// demand returns the demand record of image in pool, made on first use,
// or nil when pool is not an image class of this reconciler.
func (r *Reconciler) demand(pool, image string) *imageDemand {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps, ok := r.pools[pool]
	if !ok || !ps.cfg.ImageClass() || image == "" {
		return nil
	}
	if ps.demand == nil {
		ps.demand = map[string]*imageDemand{}
	}
	d := ps.demand[image]
	if d == nil {
		d = &imageDemand{}
		ps.demand[image] = d
	}
	return d
}

// imagePlan is what an image class's pass does: the images of the members
// to create, waiting claims' first (oldest wait first), then warm ones; and
// the ready members to stop, with why — beyond what their image wants, or
// evicted to make room for a waiting claim.
type imagePlan struct {
	create []string
	stop   map[uuid.UUID]string
}

// Starved reports whether the last pass of image class pool found no room
// for a cell a claim of this process waiting for image needs: max_cells of
// cells in use, waited for, or of images used more recently, and none
// being stopped. A wait that ends so answers empty_reason capacity rather
// than wait_elapsed (CONTRACT §21).
func (r *Reconciler) Starved(pool, image string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	ps, ok := r.pools[pool]
	return ok && ps.starved[image]
}

// imageState is one image of an image class during planning.
type imageState struct {
	name          string
	waiting, want int
	since, last   time.Time
	peak          int
	coming        int            // members provisioning
	leased        int            // members leased
	ready         []store.Member // ready members not to stop, oldest first
}

// planImages plans an image class's pass over its live members. While an
// image is warm — a claim waits for it, or it was claimed, waited for or a
// cell of it admitted within WarmIdle (so a cell made for a claim that
// gave up, or found after a restart, stays warm inventory that long) — it
// wants a cell for each waiting claim, and as many ready or coming as the
// most of its cells in use at once lately (leased or waited for; at least
// one, at most WarmPerImage): one claim waiting makes one cell, the
// image's next claim finds a warm one, and an image claimed by several
// workers at once keeps a warm cell for each, up to WarmPerImage.
//
// Room is made in this order: below max_cells a cell is created; a stop
// under way makes room once its deletion is proven; otherwise the
// least recently used warm image's oldest ready cell is evicted — for a
// waiting claim, of any image no claim waits for; for a warm cell, only of
// an image used less recently, so the most used images keep theirs when
// the class is full and two images never evict each other in turn.
func (r *Reconciler) planImages(ps *poolState, cfg Config, members []store.Member, now time.Time) imagePlan {
	images := map[string]*imageState{}
	get := func(name string) *imageState {
		im := images[name]
		if im == nil {
			im = &imageState{name: name}
			images[name] = im
		}
		return im
	}
	live, freeing := len(members), 0
	for _, m := range members {
		switch m.State {
		case lease.MemberStopping, lease.MemberCleanupPending:
			freeing++ // room once destroyed
		case lease.MemberProvisioning:
			get(m.Image).coming++
		case lease.MemberLeased:
			get(m.Image).leased++
		case lease.MemberReady:
			im := get(m.Image)
			im.ready = append(im.ready, m)
			if m.Cell != nil && m.Cell.CreatedAt.After(im.last) {
				im.last = m.Cell.CreatedAt
			}
		}
	}
	r.mu.Lock()
	for name, d := range ps.demand {
		if d.waiting == 0 && now.Sub(d.last) >= cfg.WarmIdle {
			delete(ps.demand, name) // decayed
			continue
		}
		im := get(name)
		im.waiting, im.since = d.waiting, d.since
		if d.last.After(im.last) {
			im.last = d.last
		}
		if inUse := im.waiting + im.leased; inUse >= d.peak || now.Sub(d.peakAt) >= cfg.WarmIdle {
			d.peak, d.peakAt = inUse, now
		}
		im.peak = d.peak
	}
	r.mu.Unlock()
	plan := imagePlan{stop: map[uuid.UUID]string{}}
	var waiting, warm []*imageState
	for _, im := range images {
		if im.waiting > 0 || now.Sub(im.last) < cfg.WarmIdle {
			im.want = max(im.waiting, min(cfg.WarmPerImage, max(im.peak, 1)))
		}
		// Ready cells beyond the image's want decay, oldest first.
		for im.coming+len(im.ready) > im.want && len(im.ready) > 0 {
			plan.stop[im.ready[0].CellID] = "image no longer warm"
			im.ready = im.ready[1:]
		}
		switch {
		case im.waiting > 0:
			waiting = append(waiting, im)
		case im.want > 0:
			warm = append(warm, im)
		}
	}
	slices.SortFunc(waiting, func(a, b *imageState) int {
		return cmp.Or(a.since.Compare(b.since), cmp.Compare(a.name, b.name))
	})
	// Most recently used first: the last are the first evicted.
	slices.SortFunc(warm, func(a, b *imageState) int { return cmp.Or(b.last.Compare(a.last), cmp.Compare(a.name, b.name)) })
	// fill makes up to need cells of im, evicting from victims for why
	// when the class is full; false when it found no room for one.
	fill := func(im *imageState, need int, victims []*imageState, why string) bool {
		for ; need > 0; need-- {
			switch {
			case live < cfg.Target:
				plan.create = append(plan.create, im.name)
				im.coming++
				live++
			case freeing > 0:
				freeing-- // a stop under way makes the room
			case !evict(victims, plan.stop, why):
				return false // full of cells in use, wanted or more recently used: it waits
			}
		}
		return true
	}
	starved := map[string]bool{}
	for _, im := range waiting {
		if !fill(im, im.waiting-im.coming-len(im.ready), warm, "evicted for a claim of another image") {
			starved[im.name] = true
		}
	}
	for _, im := range waiting {
		fill(im, im.want-im.coming-len(im.ready), nil, "")
	}
	for i, im := range warm {
		fill(im, im.want-im.coming-len(im.ready), warm[i+1:], "evicted for a more recently used image")
	}
	seen := make([]ImageStatus, 0, len(images))
	for _, im := range images {
		seen = append(seen, ImageStatus{Image: im.name, Ready: len(im.ready), Provisioning: im.coming, Waiting: im.waiting})
	}
	slices.SortFunc(seen, func(a, b ImageStatus) int { return cmp.Compare(a.Image, b.Image) })
	r.mu.Lock()
	ps.images, ps.starved = seen, starved
	r.mu.Unlock()
	return plan
}

// ImageStatus is one image of an image class as its reconciler's last pass
// found and left it: ready cells (not being stopped), cells provisioning
// (those it started included), and claims of this process waiting for
// one.
type ImageStatus struct {
	Image                        string
	Ready, Provisioning, Waiting int
}

// evict stops, for why, the oldest ready cell of the least recently used
// image of warm (images no claim waits for, most recently used first) that
// has one: it makes room in a full pool once destroyed. It reports whether
// it found one.
func evict(warm []*imageState, stop map[uuid.UUID]string, why string) bool {
	for i := len(warm) - 1; i >= 0; i-- {
		if im := warm[i]; len(im.ready) > 0 {
			stop[im.ready[0].CellID] = why
			im.ready = im.ready[1:]
			return true
		}
	}
	return false
}
