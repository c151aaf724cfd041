package httpapi

import (
	"errors"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// claim serves POST /v1/sterile-cells/claim (CONTRACT §5).
func (h *handler) claim(c *call) (int, any, error) {
	req, err := decodeBody(c.body, readClaim)
	if err != nil {
		return 0, nil, err
	}
	var claimID uuid.UUID
	if req.ClaimID != nil {
		if claimID = *req.ClaimID; claimID == uuid.Nil {
			return 0, nil, invalid("claim_id must not be the nil UUID")
		}
	}
	var wait uint64
	if req.WaitSeconds != nil {
		wait = *req.WaitSeconds
		// A wait may outlast the server's write timeout, which bounds the
		// other answers.
		_ = http.NewResponseController(c.w).SetWriteDeadline(time.Now().Add(time.Duration(min(wait, sandboxwich.MaxWaitSeconds)+60) * time.Second))
	}
	var image string
	if req.Image != nil {
		if image = *req.Image; image == "" {
			return 0, nil, errcode.New(errcode.ImageNotAllowed, "image must be a reference pinned by digest, not empty")
		}
	}
	var narrow *egress.Policy
	if req.Egress != nil {
		pol, err := egress.Parse(*req.Egress)
		if err != nil {
			return 0, nil, err
		}
		narrow = &pol
	}
	res, err := h.plane.Claim(c.ctx(), c.p.tenant, sandboxwich.ClaimRequest{
		ClaimID: claimID, Release: req.Release, Binding: req.Binding, LeaseSeconds: req.LeaseSeconds,
		Image: image, WaitSeconds: wait, Egress: narrow,
	})
	h.metrics.claims.WithLabelValues(claimOutcome(res, err)).Inc()
	if res.EmptyReason != "" {
		h.metrics.empty.WithLabelValues(string(res.EmptyReason)).Inc()
	}
	if err != nil {
		return 0, nil, err
	}
	resp := wire.ClaimResponse{OK: true, Lease: wire.LeaseOf(res.Lease)}
	if (wait > 0 || image != "") && res.Lease == nil {
		resp.EmptyReason = string(res.EmptyReason)
	}
	if res.Lease != nil {
		att := res.Attestation()
		resp.LeaseAttestation = &att
	}
	return http.StatusOK, resp, nil
}

// claimOutcome is the claims_total label of a claim.
func claimOutcome(res sandboxwich.ClaimResult, err error) string {
	switch {
	case errors.Is(err, errcode.ErrClaimContended):
		return outcomeContended
	case errors.Is(err, errcode.ErrConflict):
		return outcomeConflict
	case err != nil:
		return outcomeError
	case res.Replayed:
		return outcomeReplayed
	case res.Lease == nil:
		return outcomeEmpty
	}
	return outcomeLeased
}

// proofOf converts the wire lease fence.
func proofOf(p wire.LeaseProof) sandboxwich.Proof {
	return sandboxwich.NewProof(p.LeaseAttestation, p.Generation, p.Binding)
}

// validate serves POST /v1/sterile-cell-leases/{lease_id}/validate.
func (h *handler) validate(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return 0, nil, err
	}
	req, err := decodeBody(c.body, readProof)
	if err != nil {
		return 0, nil, err
	}
	l, err := h.plane.Validate(c.ctx(), c.p.tenant, id, proofOf(req))
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.ValidateResponse{OK: true, Lease: *wire.LeaseOf(&l)}, nil
}

// renew serves POST /v1/sterile-cell-leases/{lease_id}/renew (CONTRACT
// §20): 200 with the lease and the expiry it now has.
func (h *handler) renew(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return 0, nil, err
	}
	req, err := decodeBody(c.body, readRenew)
	if err != nil {
		return 0, nil, err
	}
	l, err := h.plane.Renew(c.ctx(), c.p.tenant, id, proofOf(req.LeaseProof), req.LeaseSeconds)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.RenewResponse{OK: true, Lease: *wire.LeaseOf(&l)}, nil
}

// release serves POST /v1/sterile-cell-leases/{lease_id}/release: 202 with
// the status as it stands after the stop intent was recorded.
func (h *handler) release(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return 0, nil, err
	}
	req, err := decodeBody(c.body, readReleaseRequest)
	if err != nil {
		return 0, nil, err
	}
	st, err := h.plane.Release(c.ctx(), c.p.tenant, id, proofOf(req.LeaseProof), req.Disposition)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, wire.StatusResponse{OK: true, Status: wireStatus(st)}, nil
}

// leaseStatus serves GET /v1/sterile-cell-leases/{lease_id}.
func (h *handler) leaseStatus(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return 0, nil, err
	}
	st, err := h.plane.LeaseStatus(c.ctx(), c.p.tenant, id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.StatusResponse{OK: true, Status: wireStatus(st)}, nil
}

// wireStatus is a lease status in wire form; provider_mode is the plane's,
// for pool cells only.
func wireStatus(st sandboxwich.LeaseStatus) wire.LeaseStatus {
	return wire.LeaseStatus{
		LeaseID:        st.LeaseID,
		CellID:         st.CellID,
		Generation:     st.Generation,
		State:          st.State,
		Disposition:    wire.DispositionOf(st.State),
		ProviderAbsent: st.ProviderAbsent,
		CleanupPending: st.CleanupPending,
		ProviderMode:   string(st.ProviderMode),
	}
}
