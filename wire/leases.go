package wire

import (
	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
)

// The bodies of lease listing, revocation and inventory (CONTRACT §14) and
// of the evidence route (§15). None carries an attestation or its digest.

// LeaseSummary is one lease of GET /v1/sterile-cell-leases: its status
// without provider_mode, with its binding, expiry and release set.
type LeaseSummary struct {
	LeaseID        uuid.UUID          `json:"lease_id"`
	CellID         uuid.UUID          `json:"cell_id"`
	Generation     uint64             `json:"generation"`
	State          lease.State        `json:"state"`
	Disposition    *lease.Disposition `json:"disposition"`
	ProviderAbsent bool               `json:"provider_absent"`
	CleanupPending bool               `json:"cleanup_pending"`
	Binding
	ExpiresAt    Time   `json:"expires_at"`
	ReleaseSetID string `json:"release_set_id"`
}

// LeasesResponse answers GET /v1/sterile-cell-leases, newest lease first.
// NextCursor is null on the last page; otherwise pass it as the cursor
// query parameter to read the next one.
type LeasesResponse struct {
	OK         bool           `json:"ok"`
	Leases     []LeaseSummary `json:"leases"`
	NextCursor *string        `json:"next_cursor"`
}

// RevokeRequest is the optional body of POST
// /v1/sterile-cell-leases/{id}/revoke. An empty Disposition means
// quarantined.
type RevokeRequest struct {
	Disposition lease.Disposition `json:"disposition,omitempty"`
}

// InventoryEntry is one release of GET /v1/sterile-cells/inventory.
type InventoryEntry struct {
	ReleaseSetID string             `json:"release_set_id"`
	RuntimeClass lease.RuntimeClass `json:"runtime_class"`
	PolicyDigest string             `json:"policy_digest"`
	// Ready counts the ready cells a claim of the release could take now.
	Ready int `json:"ready"`
	// MaxLeaseSeconds is the longest lease_seconds a claim now finds a
	// cell for; 0 when none is ready.
	MaxLeaseSeconds uint64 `json:"max_lease_seconds"`
	// An image class's (CONTRACT §21), for the release of the tenant's
	// image classes (described together when it has several): the
	// repositories they allow, how many cached images they allow (absent
	// when their providers keep no image cache), their max_cells and
	// max_cold summed, and the largest warm_per_image. All absent for a
	// release without an image class, so a Part I entry is unchanged.
	Images       []string `json:"images,omitempty"`
	Cached       *int     `json:"cached,omitempty"`
	MaxCells     int      `json:"max_cells,omitempty"`
	MaxCold      int      `json:"max_cold,omitempty"`
	WarmPerImage int      `json:"warm_per_image,omitempty"`
}

// InventoryResponse answers GET /v1/sterile-cells/inventory.
type InventoryResponse struct {
	OK        bool             `json:"ok"`
	Inventory []InventoryEntry `json:"inventory"`
}

// Evidence is what the plane read back from a pool cell's provider and
// agent at admission and at its last verification. Fields it did not
// record are null.
type Evidence struct {
	CellID       uuid.UUID           `json:"cell_id"`
	Pool         string              `json:"pool"`
	Provider     *string             `json:"provider"`
	ProviderMode *string             `json:"provider_mode"`
	RuntimeClass *lease.RuntimeClass `json:"runtime_class"`
	ImageDigest  *string             `json:"image_digest"`
	AgentDigest  *string             `json:"agent_digest"`
	// Egress is the cell's effective egress policy in canonical form
	// (CONTRACT §22): "none", or host:port lines; EgressDigest is its
	// SHA-256, lowercase hex.
	Egress         string `json:"egress"`
	EgressDigest   string `json:"egress_digest"`
	AdmittedAt     *Time  `json:"admitted_at"`
	LastVerifiedAt *Time  `json:"last_verified_at"`
}

// EgressHost is how many connections of a lease's cell to one host the
// egress gateway allowed and refused ("-": connections that named none).
type EgressHost struct {
	Host    string `json:"host"`
	Allowed int    `json:"allowed"`
	Refused int    `json:"refused"`
}

// EgressResponse answers GET /v1/sterile-cell-leases/{id}/egress.
type EgressResponse struct {
	OK    bool         `json:"ok"`
	Hosts []EgressHost `json:"hosts"`
}

// EvidenceResponse answers GET /v1/sterile-cell-leases/{id}/evidence.
type EvidenceResponse struct {
	OK       bool     `json:"ok"`
	Evidence Evidence `json:"evidence"`
}
