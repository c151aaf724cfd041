package sandboxwich

import (
	"context"
	"encoding/base64"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store"
)

// Tenant-scoped lease operations without a lease fence (CONTRACT §14
// listing, revocation and inventory, §15 evidence): what a harness reads
// before a run, and what ends a lease whose attestation was lost. None of
// them returns an attestation or its digest.

// Limits of a lease listing page.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// LeaseQuery selects a page of a tenant's leases.
type LeaseQuery struct {
	// Binding filters: each non-empty field must equal the lease's.
	Binding lease.Binding
	// Live, when set, keeps the leases that are (true) or are not (false)
	// live: the cell is leased and the lease has not expired, a pool cell
	// whose release or revocation is recorded but not yet confirmed by the
	// provider included.
	Live *bool
	// Limit bounds the page: 0 means DefaultListLimit; at most
	// MaxListLimit.
	Limit int
	// Cursor continues a listing: the NextCursor of the previous page,
	// "" for the first.
	Cursor string
}

// LeaseSummary is one lease of a listing: its status, binding, expiry and
// release set.
type LeaseSummary struct {
	LeaseStatus
	Binding      lease.Binding
	ExpiresAt    time.Time
	ReleaseSetID string
}

// LeasePage is one page of a listing, newest lease first. NextCursor is ""
// on the last page.
type LeasePage struct {
	Leases     []LeaseSummary
	NextCursor string
}

// ListLeases returns a page of the tenant's leases, newest first (lease
// IDs are UUIDv7), terminal ones included. Pages are keyset pages: a lease
// made while a caller pages through sorts before the first page, so no
// lease is listed twice and none that existed is skipped. A bad filter,
// limit or cursor is errcode.ErrInvalidRequest.
func (p *Plane) ListLeases(ctx context.Context, tenantID string, q LeaseQuery) (LeasePage, error) {
	for _, f := range q.Binding.Fields() {
		if f.Value != "" && !lease.ValidIdentifier(f.Value) {
			return LeasePage{}, errcode.New(errcode.InvalidRequest, f.Name+" is invalid")
		}
	}
	limit := q.Limit
	switch {
	case limit == 0:
		limit = DefaultListLimit
	case limit < 1 || limit > MaxListLimit:
		return LeasePage{}, errcode.New(errcode.InvalidRequest, "limit must be from 1 to "+strconv.Itoa(MaxListLimit))
	}
	before, err := parseCursor(q.Cursor)
	if err != nil {
		return LeasePage{}, err
	}
	if tenantID == "" {
		return LeasePage{}, errcode.New(errcode.InvalidRequest, "tenant is required")
	}
	// One more than the page says whether another page follows.
	recs, err := p.store.ListLeases(ctx, store.ListLeasesParams{TenantID: tenantID, Binding: q.Binding, Live: q.Live,
		Now: p.Now(), Before: before, Limit: limit + 1})
	if err != nil {
		return LeasePage{}, err
	}
	page := LeasePage{Leases: make([]LeaseSummary, 0, min(len(recs), limit))}
	for i, rec := range recs {
		if i == limit {
			page.NextCursor = cursorOf(recs[i-1].Cell.Lease.ID)
			break
		}
		l := rec.Cell.Lease
		page.Leases = append(page.Leases, LeaseSummary{LeaseStatus: p.statusOf(rec), Binding: l.Binding,
			ExpiresAt: l.ExpiresAt, ReleaseSetID: l.Release.ReleaseSetID})
	}
	return page, nil
}

// A cursor is the last lease ID of a page, behind a version byte, in
// unpadded base64url: opaque to callers, and free to change with its
// version.
const cursorVersion = 1

func cursorOf(id uuid.UUID) string {
	return base64.RawURLEncoding.EncodeToString(append([]byte{cursorVersion}, id[:]...))
}

var errCursor = errcode.New(errcode.InvalidRequest, "cursor is invalid: pass next_cursor of the previous page as it is")

// parseCursor returns the lease ID a cursor continues after; uuid.Nil for
// "".
func parseCursor(c string) (uuid.UUID, error) {
	if c == "" {
		return uuid.Nil, nil
	}
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil || len(b) != 1+len(uuid.UUID{}) || b[0] != cursorVersion {
		return uuid.Nil, errCursor
	}
	id := uuid.UUID(b[1:])
	// Only the one spelling cursorOf makes (the decoder skips line breaks
	// and ignores stray low bits).
	if id == uuid.Nil || cursorOf(id) != c {
		return uuid.Nil, errCursor
	}
	return id, nil
}

// Revoke ends a live lease of the tenant without its attestation, for a
// harness that crashed and lost it (CONTRACT §14). It only ever ends
// authority. A pool cell stops as on Release: its stop is recorded with
// disposition d ("" means lease.Quarantined) and the pool destroys the cell
// and proves it; the cell reads leased until then, as after a release, and
// a repeat with the same disposition changes nothing. A cell prepared by an
// external worker is quarantined at once, whatever d says. A lease no
// longer live is errcode.ErrConflict (wrapping lease.ErrNotLive); unknown
// and foreign leases are errcode.ErrNotFound.
func (p *Plane) Revoke(ctx context.Context, tenantID string, leaseID uuid.UUID, d lease.Disposition) (LeaseStatus, error) {
	if d == "" {
		d = lease.Quarantined
	}
	if !lease.ValidDisposition(d) {
		return LeaseStatus{}, errcode.New(errcode.InvalidRequest, "disposition must be destroyed or quarantined")
	}
	rec, err := p.store.Revoke(ctx, store.RevokeParams{TenantID: tenantID, LeaseID: leaseID, Disposition: d, Now: p.Now()})
	if err != nil {
		return LeaseStatus{}, err
	}
	p.log.Info("lease revoked", "tenant", tenantID, "lease_id", leaseID, "cell_id", rec.Cell.ID,
		"pool", rec.Cell.PoolName, "disposition", d)
	if p.pools != nil && rec.Member != nil {
		p.pools.Trigger()
	}
	return p.statusOf(rec), nil
}

// InventoryEntry is one release of a tenant's inventory: how many ready
// cells a claim for it could take now, and the longest lease it would get.
type InventoryEntry struct {
	ReleaseSetID string
	RuntimeClass lease.RuntimeClass
	PolicyDigest string
	// Ready counts the release's ready cells that outlive the shortest
	// lease. A pool's ready floor may hold some of them back.
	Ready int
	// MaxLeaseSeconds is the longest lease_seconds a claim now finds a
	// cell for: the plane's maximum, or less when no ready cell outlives
	// it; 0 when none is ready.
	MaxLeaseSeconds uint64
	// ImageClass describes the tenant's image classes of the release
	// (CONTRACT §21), whose cells Ready never counts; nil when it has
	// none.
	ImageClass *ImageClassInventory
}

// ImageClassInventory is what an inventory entry adds for the image
// classes of its release (CONTRACT §21 "Inventory"). A release has one
// image class in the common case; several are described together.
type ImageClassInventory struct {
	// Images are the repositories the classes allow (pool.Config.Images:
	// host/repo or host/prefix/*), in configuration order, each once.
	Images []string
	// Cached counts the images (distinct digests) in the classes'
	// providers' image caches that the classes allow: never an image
	// they do not allow. nil when no class's provider keeps an image
	// cache (driver.ImageCache), or it could not be read.
	Cached *int
	// MaxCells and MaxCold are the classes' max_cells and max_cold,
	// summed; WarmPerImage the largest warm_per_image.
	MaxCells, MaxCold, WarmPerImage int
}

// Inventory lists the tenant's inventory by release (set, runtime class,
// policy digest), ordered by those: the releases of its ready cells, and
// those of the plane's pools for the tenant, with 0 ready when they have
// none now. No signatures, no cell IDs.
func (p *Plane) Inventory(ctx context.Context, tenantID string) ([]InventoryEntry, error) {
	now := p.Now()
	got, err := p.store.Inventory(ctx, store.InventoryParams{TenantID: tenantID, After: now.Add(MinLeaseSeconds * time.Second)})
	if err != nil {
		return nil, err
	}
	out := make([]InventoryEntry, 0, len(got))
	for _, e := range got {
		// The claim of n seconds needs a deadline later than now + n.
		left := uint64((e.LatestDeadline.Sub(now) - time.Microsecond) / time.Second)
		out = append(out, InventoryEntry{ReleaseSetID: e.ReleaseSetID, RuntimeClass: e.RuntimeClass,
			PolicyDigest: e.PolicyDigest, Ready: e.Ready, MaxLeaseSeconds: min(left, p.maxLease)})
	}
	key := func(e InventoryEntry) string {
		return e.ReleaseSetID + "\x00" + string(e.RuntimeClass) + "\x00" + e.PolicyDigest
	}
	for _, c := range p.poolCfgs {
		r := c.Release
		e := InventoryEntry{ReleaseSetID: r.ReleaseSetID, RuntimeClass: r.RuntimeClass, PolicyDigest: r.PolicyDigest}
		if c.TenantID == tenantID && !slices.ContainsFunc(out, func(o InventoryEntry) bool { return key(o) == key(e) }) {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b InventoryEntry) int { return strings.Compare(key(a), key(b)) })
	p.inventoryImageClasses(ctx, tenantID, out, key)
	return out, nil
}

// inventoryImageClasses completes the inventory entries of the releases of
// the tenant's image classes (every such release has an entry: Inventory
// lists the releases of the tenant's pools). An image cache that cannot
// be read leaves its release's Cached nil, and is logged.
func (p *Plane) inventoryImageClasses(ctx context.Context, tenantID string, out []InventoryEntry, key func(InventoryEntry) string) {
	if p.pools == nil {
		return
	}
	type cacheRead struct {
		imgs []driver.CachedImage
		err  error
	}
	reads := map[string]cacheRead{}         // by CacheID, read once
	digests := map[string]map[string]bool{} // the cached digests each release's classes allow
	unread := map[string]bool{}             // releases with a class whose cache could not be read
	for _, name := range p.pools.Names() {
		cfg, _ := p.pools.Pool(name)
		if cfg.TenantID != tenantID || !cfg.ImageClass() {
			continue
		}
		r := cfg.Release
		i := slices.IndexFunc(out, func(e InventoryEntry) bool {
			return key(e) == key(InventoryEntry{ReleaseSetID: r.ReleaseSetID, RuntimeClass: r.RuntimeClass, PolicyDigest: r.PolicyDigest})
		})
		if i < 0 {
			continue
		}
		ic := out[i].ImageClass
		if ic == nil {
			ic = &ImageClassInventory{}
			out[i].ImageClass = ic
		}
		for _, pat := range cfg.Images {
			if !slices.Contains(ic.Images, pat) {
				ic.Images = append(ic.Images, pat)
			}
		}
		ic.MaxCells += cfg.Target
		ic.MaxCold += cfg.MaxProvisioning
		ic.WarmPerImage = max(ic.WarmPerImage, cfg.WarmPerImage)
		cache, ok := cfg.Provider.(driver.ImageCache)
		if !ok {
			continue
		}
		id := cache.CacheID()
		rd, done := reads[id]
		if !done {
			rd.imgs, rd.err = cache.CachedImages(ctx)
			reads[id] = rd
			if rd.err != nil {
				p.log.Warn("inventory: reading the image cache", "pool", name, "error", rd.err)
			}
		}
		k := key(out[i])
		if rd.err != nil {
			unread[k] = true
			continue
		}
		if digests[k] == nil {
			digests[k] = map[string]bool{}
		}
		for _, img := range rd.imgs {
			if canonical, _, err := pool.CanonicalImage(img.Reference); err == nil && cfg.Serves(canonical) {
				digests[k][img.Digest] = true
			}
		}
	}
	for i := range out {
		if ds, k := digests[key(out[i])], key(out[i]); ds != nil && !unread[k] {
			n := len(ds)
			out[i].ImageClass.Cached = &n
		}
	}
}

// Evidence is what the plane read back from a pool cell's provider and
// agent when it admitted the cell and when it last verified it (CONTRACT
// §15). It never carries the attestation or its digest.
type Evidence struct {
	CellID uuid.UUID
	Pool   string
	// Provider and ProviderMode describe the pool's provider; "" when the
	// pool is no longer configured in this plane.
	Provider     string
	ProviderMode ProviderMode
	// RuntimeClass is the runtime class the provider demonstrably
	// admitted; "" when none was recorded (a cell admitted by an earlier
	// version).
	RuntimeClass lease.RuntimeClass
	// ImageDigest is the image digest the provider reported as admitted
	// ("sha256:<hex>"); "" when the cell's pool pins no image.
	ImageDigest string
	// AgentDigest is the cell agent's build digest the provider reported;
	// "" when the cell runs no agent.
	AgentDigest string
	// Egress is the cell's effective egress policy in canonical form
	// (CONTRACT §22): its pool's, or the narrower one its claim named;
	// EgressDigest is its SHA-256 (egress_digest).
	Egress       string
	EgressDigest string
	// AdmittedAt and LastVerifiedAt are zero when not recorded.
	AdmittedAt     time.Time
	LastVerifiedAt time.Time
}

// Evidence returns the evidence of a lease's cell. Unknown and foreign
// leases are errcode.ErrNotFound, and so is a cell prepared by an external
// worker: the plane read nothing back from its provider.
func (p *Plane) Evidence(ctx context.Context, tenantID string, leaseID uuid.UUID) (Evidence, error) {
	ev, err := p.store.Evidence(ctx, tenantID, leaseID)
	if err != nil {
		return Evidence{}, err
	}
	if ev.Pool == "" {
		return Evidence{}, errcode.New(errcode.NotFound,
			"cell was prepared by an external worker; the plane holds no evidence of it")
	}
	out := Evidence{CellID: ev.CellID, Pool: ev.Pool, RuntimeClass: ev.RuntimeClass, AgentDigest: ev.AgentDigest,
		ImageDigest: ev.ImageDigest, Egress: ev.Egress, EgressDigest: egress.DigestOf(ev.Egress),
		AdmittedAt: ev.AdmittedAt, LastVerifiedAt: ev.VerifiedAt}
	if p.pools != nil {
		if cfg, ok := p.pools.Pool(ev.Pool); ok {
			caps := cfg.Provider.Capabilities()
			out.Provider, out.ProviderMode = caps.Kind, ProviderMode(caps.Mode)
		}
	}
	return out, nil
}
