package sandboxwich

import (
	"context"
	"time"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
)

// ProviderMode says whether a pool's provider creates real isolation
// boundaries (driver.Mode).
type ProviderMode string

// Provider modes.
const (
	// ProviderApply: the provider creates real objects; a verified
	// observation is evidence that the runtime exists.
	ProviderApply ProviderMode = "apply"
	// ProviderDryRun: the provider simulates the whole life cycle; a
	// dry-run result is never evidence that a runtime existed.
	ProviderDryRun ProviderMode = "dry_run"
)

// PoolStatus is one pool's configuration and state, as the operator routes
// report it.
type PoolStatus struct {
	Name     string
	TenantID string
	Release  lease.Release
	// Target, ReadyFloor, MaxProvisioning and ReadyTTL are the pool's
	// configuration (pool.Config).
	Target          int
	ReadyFloor      int
	MaxProvisioning int
	ReadyTTL        time.Duration
	// Provider is the provider's kind and ProviderMode its mode
	// (driver.Capabilities).
	Provider     string
	ProviderMode ProviderMode
	// Members counts the pool's members by state, every state present.
	Members       map[lease.MemberState]int
	LastReconcile time.Time // zero before the first pass
	LastError     string
	// PrepareError is the provider's last failed Prepare, such as an image
	// that cannot be pulled; "" once it succeeded. While it is set the
	// pool creates no member.
	PrepareError string
	// ImageClass, WarmPerImage and Images describe an image class
	// (CONTRACT §21): its allowed repositories (pool.Config.Images), the
	// warm cells it keeps per recent image, and each image's cells and
	// waiting claims as of its last pass (ready, provisioning — the cold
	// provisions in flight — and this replica's waiting claims). Target
	// is its max_cells and MaxProvisioning its max_cold.
	ImageClass   []string
	WarmPerImage int
	Images       []ImageStatus
}

// ImageStatus is one image of an image class (PoolStatus.Images): its
// ready cells, its cells provisioning, and the claims of this replica
// waiting for one.
type ImageStatus struct {
	Image                        string
	Ready, Provisioning, Waiting int
}

// PoolStatus reports every pool of the plane, in configuration order; nil
// when the plane has no pools.
func (p *Plane) PoolStatus(ctx context.Context) ([]PoolStatus, error) {
	if p.pools == nil {
		return nil, nil
	}
	sts, err := p.pools.Status(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]PoolStatus, len(sts))
	for i, s := range sts {
		out[i] = poolStatusOf(s)
	}
	return out, nil
}

func poolStatusOf(s pool.Status) PoolStatus {
	out := PoolStatus{Name: s.Config.Name, TenantID: s.Config.TenantID, Release: s.Config.Release,
		Target: s.Config.Target, ReadyFloor: s.Config.ReadyFloor, MaxProvisioning: s.Config.MaxProvisioning,
		ReadyTTL: s.Config.ReadyTTL, Provider: s.Capabilities.Kind, ProviderMode: ProviderMode(s.Capabilities.Mode),
		Members: s.Members, LastReconcile: s.LastReconcile, LastError: s.LastError, PrepareError: s.PrepareError,
		ImageClass: s.Config.Images}
	for _, im := range s.Images {
		out.Images = append(out.Images, ImageStatus(im))
	}
	if s.Config.ImageClass() {
		out.WarmPerImage = s.Config.WarmPerImage
	}
	return out
}
