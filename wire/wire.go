// Package wire holds the JSON bodies of the /v1 HTTP contract, shared by
// the server (httpapi) and the Go client (client). Field names are
// snake_case; absent optional response fields are emitted as null; UUIDs are
// accepted in any common spelling and emitted lowercase and hyphenated;
// timestamps are emitted as RFC 3339 UTC with a 0, 3, 6 or 9 digit fraction.
package wire

import (
	"encoding/json"
	"errors"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// OperatorHeader is the header that carries the operator token next to a
// tenant bearer token (CONTRACT §10.1).
const OperatorHeader = "x-sandboxwich-operator-token"

// Time is a timestamp on the wire: emitted in the contract's canonical UTC
// form ("2026-08-07T12:00:00.123Z"), accepted with any RFC 3339 offset.
type Time struct{ time.Time }

// MarshalJSON emits the canonical form.
func (t Time) MarshalJSON() ([]byte, error) {
	return []byte(`"` + attest.WireTime(t.Time) + `"`), nil
}

// UnmarshalJSON accepts any RFC 3339 timestamp.
func (t *Time) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("timestamp must be an RFC 3339 string")
	}
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return errors.New("timestamp must be RFC 3339")
	}
	// An offset can carry a year in range out of it; such an instant has no
	// RFC 3339 form in UTC, so it could never be answered back.
	if v = v.UTC(); v.Year() < 0 || v.Year() > 9999 {
		return errors.New("timestamp is outside the years 0000-9999 in UTC")
	}
	t.Time = v
	return nil
}

// Release is the signed trust class.
type Release = lease.Release

// Binding is the tenant-side identity of a lease.
type Binding = lease.Binding

// ClaimRequest is the body of POST /v1/sterile-cells/claim.
type ClaimRequest struct {
	ClaimID *uuid.UUID `json:"claim_id,omitempty"`
	Release Release    `json:"release"`
	Binding
	LeaseSeconds *uint64 `json:"lease_seconds,omitempty"`
	// Image asks for a cell of that image, pinned by digest (CONTRACT §21).
	Image *string `json:"image,omitempty"`
	// WaitSeconds is how long the claim may wait for a cell (CONTRACT §21):
	// 0 to 300; absent or 0 answers at once.
	WaitSeconds *uint64 `json:"wait_seconds,omitempty"`
	// Egress narrows the egress policy of the pool that serves the claim
	// (CONTRACT §22): host[:port] entries, [] for none; absent or null
	// keeps the pool's.
	Egress *[]string `json:"egress,omitempty"`
}

// Lease is the lease object of claim and validate responses.
type Lease struct {
	LeaseID    uuid.UUID `json:"lease_id"`
	CellID     uuid.UUID `json:"cell_id"`
	Generation uint64    `json:"generation"`
	Release    Release   `json:"release"`
	Binding
	ExpiresAt Time `json:"expires_at"`
}

// LeaseOf returns the wire form of a lease.
func LeaseOf(l *lease.Lease) *Lease {
	if l == nil {
		return nil
	}
	return &Lease{LeaseID: l.ID, CellID: l.CellID, Generation: l.Generation, Release: l.Release,
		Binding: l.Binding, ExpiresAt: Time{l.ExpiresAt}}
}

// ClaimResponse answers a claim. Lease and LeaseAttestation are null when no
// cell was available.
type ClaimResponse struct {
	OK               bool    `json:"ok"`
	Lease            *Lease  `json:"lease"`
	LeaseAttestation *string `json:"lease_attestation"`
	// EmptyReason says why a claim that carried image or wait_seconds
	// (CONTRACT §21) found no cell; absent otherwise, and from every Part
	// I answer.
	EmptyReason string `json:"empty_reason,omitempty"`
}

// LeaseProof is the lease fence a tenant presents (validate, release, exec).
type LeaseProof struct {
	LeaseAttestation string `json:"lease_attestation"`
	Generation       uint64 `json:"generation"`
	Binding
}

// ValidateRequest is the body of POST /v1/sterile-cell-leases/{id}/validate.
type ValidateRequest = LeaseProof

// ValidateResponse answers a validate.
type ValidateResponse struct {
	OK    bool  `json:"ok"`
	Lease Lease `json:"lease"`
}

// ReleaseRequest is the body of POST /v1/sterile-cell-leases/{id}/release.
type ReleaseRequest struct {
	LeaseProof
	Disposition lease.Disposition `json:"disposition"`
}

// RenewRequest is the body of POST /v1/sterile-cell-leases/{id}/renew
// (CONTRACT §20): the lease fence and the lease length asked for from now,
// clamped as a claim's is.
type RenewRequest struct {
	LeaseProof
	LeaseSeconds uint64 `json:"lease_seconds"`
}

// RenewResponse answers a renewal: the same lease with the expiry it now
// has (never earlier than before; at most the cell's lifetime cap).
type RenewResponse = ValidateResponse

// LeaseStatus is the status object of a lease.
type LeaseStatus struct {
	LeaseID        uuid.UUID          `json:"lease_id"`
	CellID         uuid.UUID          `json:"cell_id"`
	Generation     uint64             `json:"generation"`
	State          lease.State        `json:"state"`
	Disposition    *lease.Disposition `json:"disposition"`
	ProviderAbsent bool               `json:"provider_absent"`
	CleanupPending bool               `json:"cleanup_pending"`
	// ProviderMode is "apply" or "dry_run" for pool cells, absent otherwise.
	ProviderMode string `json:"provider_mode,omitempty"`
}

// StatusResponse answers a lease status read and a release.
type StatusResponse struct {
	OK     bool        `json:"ok"`
	Status LeaseStatus `json:"status"`
}

// ExecRequest is the body of POST /v1/sterile-cell-leases/{id}/exec.
type ExecRequest struct {
	LeaseProof
	Argv           []string          `json:"argv"`
	StdinBase64    string            `json:"stdin_base64,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	TimeoutSeconds *uint64           `json:"timeout_seconds,omitempty"`
	// Cwd is the absolute working directory in the cell; empty means the
	// cell's home.
	Cwd string `json:"cwd,omitempty"`
	// User is UserCell (empty too) or UserRoot.
	User string `json:"user,omitempty"`
	// MaxOutputBytes caps each of stdout and stderr, in bytes, up to the
	// server's ceiling (SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES); absent
	// means the server's default cap (CONTRACT §25).
	MaxOutputBytes *uint64 `json:"max_output_bytes,omitempty"`
}

// ExecResponse answers an exec: how the command ended, and its output.
type ExecResponse struct {
	ExecExit
	StdoutBase64 string `json:"stdout_base64"`
	StderrBase64 string `json:"stderr_base64"`
}

// ExecExit is how a command ended: the exec answer without its output, and
// the data of a streamed exec's exit event.
type ExecExit struct {
	OK bool `json:"ok"`
	// ExitCode is the child's code, or 128 + the signal number when a
	// signal ended it (137 at a timeout).
	ExitCode int `json:"exit_code"`
	// Truncated reports that stdout or stderr hit its cap.
	Truncated bool `json:"truncated"`
	// MaxOutputBytes is the cap of each stream that applied, in bytes:
	// the request's max_output_bytes or the server's default.
	MaxOutputBytes int   `json:"max_output_bytes"`
	DurationMS     int64 `json:"duration_ms"`
	// TimedOut reports that the command was killed at its timeout.
	TimedOut bool `json:"timed_out"`
	// Signal names the signal that ended the command ("KILL"), or is nil.
	Signal *string `json:"signal"`
	// Reason is ReasonExited, ReasonTimedOut or ReasonKilled.
	Reason string `json:"reason"`
	// Message says why a killed command was killed (its lease expired,
	// or was released or revoked); absent otherwise.
	Message string `json:"message,omitempty"`
}

// PrepareRequest is the body of POST /v1/workers/{id}/sterile-cells/prepare.
type PrepareRequest struct {
	CellID         uuid.UUID `json:"cell_id"`
	Release        Release   `json:"release"`
	ProviderCellID string    `json:"provider_cell_id"`
	ExpiresAt      Time      `json:"expires_at"`
}

// Cell is the cell object of the worker routes.
type Cell struct {
	CellID         uuid.UUID          `json:"cell_id"`
	WorkerID       string             `json:"worker_id"`
	ProviderCellID string             `json:"provider_cell_id"`
	State          lease.State        `json:"state"`
	Generation     uint64             `json:"generation"`
	Release        Release            `json:"release"`
	ExpiresAt      Time               `json:"expires_at"`
	Disposition    *lease.Disposition `json:"disposition"`
}

// CellOf returns the wire form of a cell.
func CellOf(c *lease.Cell) Cell {
	return Cell{CellID: c.ID, WorkerID: c.WorkerID, ProviderCellID: c.ProviderCellID, State: c.State,
		Generation: c.Generation, Release: c.Release, ExpiresAt: Time{c.ExpiresAt}, Disposition: DispositionOf(c.State)}
}

// DispositionOf returns the disposition of a cell in state s: nil while live.
func DispositionOf(s lease.State) *lease.Disposition {
	if !s.Terminal() {
		return nil
	}
	return &s
}

// CellResponse answers prepare, retire and destroy.
type CellResponse struct {
	OK   bool `json:"ok"`
	Cell Cell `json:"cell"`
}

// CellClaim is the fenced claim that leased a worker's cell. A cell leased
// by an unfenced claim has none ("claim": null).
type CellClaim struct {
	ClaimID    uuid.UUID `json:"claim_id"`
	LeaseID    uuid.UUID `json:"lease_id"`
	Generation uint64    `json:"generation"`
	ExpiresAt  Time      `json:"expires_at"`
}

// WorkerCellResponse answers GET /v1/workers/{id}/sterile-cells/{cell_id}.
type WorkerCellResponse struct {
	OK    bool       `json:"ok"`
	Cell  Cell       `json:"cell"`
	Claim *CellClaim `json:"claim"`
}

// RetireRequest is the body of the retire route.
type RetireRequest struct {
	Generation uint64 `json:"generation"`
}

// DestroyRequest is the body of the worker destroy route.
type DestroyRequest struct {
	LeaseID     uuid.UUID         `json:"lease_id"`
	Generation  uint64            `json:"generation"`
	Disposition lease.Disposition `json:"disposition"`
}

// Pool is one pool in GET /v1/pools.
type Pool struct {
	Name            string         `json:"name"`
	Provider        string         `json:"provider"`
	Mode            string         `json:"mode"`
	TenantID        string         `json:"tenant_id"`
	Release         Release        `json:"release"`
	Target          int            `json:"target"`
	ReadyFloor      int            `json:"ready_floor"`
	MaxProvisioning int            `json:"max_provisioning"`
	ReadyTTLSeconds int            `json:"ready_ttl_seconds"`
	Members         map[string]int `json:"members"`
	LastReconcileAt *Time          `json:"last_reconcile_at"`
	LastError       *string        `json:"last_error"`
	// An image class's (CONTRACT §21): its allowed repositories, max_cells
	// and max_cold (target and max_provisioning above, by the names of its
	// keys), warm_per_image, and each image's cells and waiting claims as
	// of its reconciler's last pass. Absent for a fixed pool.
	Images       []string     `json:"images,omitempty"`
	MaxCells     int          `json:"max_cells,omitempty"`
	MaxCold      int          `json:"max_cold,omitempty"`
	WarmPerImage int          `json:"warm_per_image,omitempty"`
	ImageCells   []ImageCells `json:"image_cells,omitempty"`
}

// ImageCells is one image of an image class in a pool listing: ready
// cells, cold provisions in flight, and claims waiting for one (on the
// replica that answers).
type ImageCells struct {
	Image        string `json:"image"`
	Ready        int    `json:"ready"`
	Provisioning int    `json:"provisioning"`
	Waiting      int    `json:"waiting"`
}

// PoolsResponse answers GET /v1/pools.
type PoolsResponse struct {
	OK    bool   `json:"ok"`
	Pools []Pool `json:"pools"`
}

// ErrorResponse is the body of every error.
type ErrorResponse struct {
	OK      bool   `json:"ok"`
	Code    string `json:"code"`
	Message string `json:"message"`
}
