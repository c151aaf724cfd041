package httpapi

import (
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// The request bodies of CONTRACT §5–7 and §14, decoded into their wire types. Each
// decoder returns the first shape error: 400 for malformed JSON, 422 for a
// missing or null required field, a wrong type, an unknown enum value, a bad
// UUID or timestamp, or an integer that is negative or not an integer.

var (
	runtimeClasses = []string{string(lease.KataMicroVM), string(lease.GVisorLowerRisk)}
	dispositions   = []string{string(lease.Destroyed), string(lease.Quarantined)}
	users          = []string{wire.UserCell, wire.UserRoot}
)

// decodeBody parses body and applies read to its top-level object.
func decodeBody[T any](body []byte, read func(o *object) T) (T, error) {
	var zero T
	o, err := parseObject(body)
	if err != nil {
		return zero, err
	}
	v := read(o)
	if err := o.Err(); err != nil {
		return zero, err
	}
	return v, nil
}

func readRelease(o *object) wire.Release {
	r := o.obj("release")
	if r == nil {
		return wire.Release{}
	}
	return wire.Release{
		ReleaseSetID: r.str("release_set_id"),
		RuntimeClass: lease.RuntimeClass(r.enum("runtime_class", runtimeClasses...)),
		PolicyDigest: r.str("policy_digest"),
		Signature:    r.str("signature"),
	}
}

func readBinding(o *object) wire.Binding {
	return wire.Binding{
		OrganizationID:  o.str("organization_id"),
		WorkspaceID:     o.str("workspace_id"),
		ThreadID:        o.str("thread_id"),
		RunnerSessionID: o.str("runner_session_id"),
	}
}

func readClaim(o *object) wire.ClaimRequest {
	return wire.ClaimRequest{
		ClaimID:      o.optUUID("claim_id"),
		Release:      readRelease(o),
		Binding:      readBinding(o),
		LeaseSeconds: o.optUint("lease_seconds"),
		Image:        o.optStrPtr("image"),
		WaitSeconds:  o.optUint("wait_seconds"),
		Egress:       o.optStrs("egress"),
	}
}

func readProof(o *object) wire.LeaseProof {
	return wire.LeaseProof{
		LeaseAttestation: o.str("lease_attestation"),
		Generation:       o.uint("generation"),
		Binding:          readBinding(o),
	}
}

func readRenew(o *object) wire.RenewRequest {
	return wire.RenewRequest{LeaseProof: readProof(o), LeaseSeconds: o.uint("lease_seconds")}
}

func readReleaseRequest(o *object) wire.ReleaseRequest {
	return wire.ReleaseRequest{
		LeaseProof:  readProof(o),
		Disposition: lease.Disposition(o.enum("disposition", dispositions...)),
	}
}

func readExec(o *object) wire.ExecRequest {
	return wire.ExecRequest{
		LeaseProof:     readProof(o),
		Argv:           o.strs("argv"),
		StdinBase64:    o.optStr("stdin_base64"),
		Env:            o.optStrMap("env"),
		TimeoutSeconds: o.optUint("timeout_seconds"),
		Cwd:            o.optStr("cwd"),
		User:           o.optEnum("user", users...),
		MaxOutputBytes: o.optUint("max_output_bytes"),
	}
}

func readPrepare(o *object) wire.PrepareRequest {
	return wire.PrepareRequest{
		CellID:         o.uuid("cell_id"),
		Release:        readRelease(o),
		ProviderCellID: o.str("provider_cell_id"),
		ExpiresAt:      wire.Time{Time: o.timestamp("expires_at")},
	}
}

func readRetire(o *object) wire.RetireRequest {
	return wire.RetireRequest{Generation: o.uint("generation")}
}

func readDestroy(o *object) wire.DestroyRequest {
	return wire.DestroyRequest{
		LeaseID:     o.uuid("lease_id"),
		Generation:  o.uint("generation"),
		Disposition: lease.Disposition(o.enum("disposition", dispositions...)),
	}
}
