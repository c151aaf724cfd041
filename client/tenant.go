package client

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// Claim is the outcome of [Client.Claim]. Lease is nil when no ready cell
// matched (an empty claim); ClaimID is the claim ID that was sent, set even
// when Claim returns an error.
//
// The lease attestation is kept in an unexported field: read it with
// [Claim.Attestation] (or use [Claim.Proof]). Formatting a Claim with fmt
// (every verb, %+v and %#v included), logging it with log/slog, or encoding
// it as JSON never shows the attestation.
type Claim struct {
	Lease   *wire.Lease
	ClaimID uuid.UUID
	// EmptyReason says why a claim that waited (req.WaitSeconds) found no
	// cell, such as "wait_elapsed"; "" otherwise (CONTRACT §21).
	EmptyReason string

	attestation string
}

// Attestation returns the raw lease attestation ("swla1_…"), or "" for an
// empty claim. It is a bearer secret for this claimer alone: keep it out of
// logs, argv, environment variables and error messages.
func (c Claim) Attestation() string { return c.attestation }

// Empty reports whether no cell was leased.
func (c Claim) Empty() bool { return c.Lease == nil }

// Proof returns the lease fence that Validate, Release and Exec present: the
// attestation, the generation and the binding of the lease. It is the zero
// proof for an empty claim.
func (c Claim) Proof() wire.LeaseProof {
	if c.Lease == nil {
		return wire.LeaseProof{}
	}
	return wire.LeaseProof{LeaseAttestation: c.attestation, Generation: c.Lease.Generation, Binding: c.Lease.Binding}
}

// String describes the claim without its attestation.
func (c Claim) String() string {
	if c.Lease == nil {
		return fmt.Sprintf("client.Claim{claim_id=%s, lease=null}", c.ClaimID)
	}
	return fmt.Sprintf("client.Claim{claim_id=%s, lease_id=%s, cell_id=%s, generation=%d, expires_at=%s, attestation=REDACTED}",
		c.ClaimID, c.Lease.LeaseID, c.Lease.CellID, c.Lease.Generation, c.Lease.ExpiresAt.UTC().Format(time.RFC3339Nano))
}

// Format writes String for every verb, so that no verb (%v, %+v, %#v, %s,
// %q, …) shows the attestation.
func (c Claim) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(c.String())) }

// LogValue keeps the attestation out of log/slog output.
func (c Claim) LogValue() slog.Value {
	if c.Lease == nil {
		return slog.GroupValue(slog.String("claim_id", c.ClaimID.String()), slog.Bool("empty", true))
	}
	return slog.GroupValue(slog.String("claim_id", c.ClaimID.String()),
		slog.String("lease_id", c.Lease.LeaseID.String()), slog.String("cell_id", c.Lease.CellID.String()))
}

// Claim leases one ready cell that matches req's release, bound to req's
// binding (POST /v1/sterile-cells/claim). A nil (or nil-UUID) req.ClaimID is
// replaced by a new UUIDv7, so every claim is fenced. The body is encoded
// once and resent byte for byte, with the same claim ID, on transport errors,
// 5xx, 429 and sterile_cell_claim_contended (see the package documentation):
// a retry after a lost response returns the same lease, never a second one.
//
// An empty claim (no matching ready cell) is not an error: Lease is nil. The
// returned Claim carries ClaimID even with an error, so the caller can retry
// later under the same fence.
//
// With req.WaitSeconds (at most 300), the server holds the claim until a
// cell is leased to it or the wait ends (EmptyReason "wait_elapsed"):
// there is no need to poll. A retry during the wait, with the same
// claim_id and body, joins it. Bound ctx by more than the wait.
func (c *Client) Claim(ctx context.Context, req wire.ClaimRequest) (Claim, error) {
	if req.ClaimID == nil || *req.ClaimID == uuid.Nil {
		id, err := c.newClaimID()
		if err != nil {
			return Claim{}, fmt.Errorf("client: generate claim_id: %w", err)
		}
		req.ClaimID = &id
	}
	out := Claim{ClaimID: *req.ClaimID}
	var resp wire.ClaimResponse
	if err := c.do(ctx, request{method: http.MethodPost, path: "/sterile-cells/claim", body: req, retry: true}, &resp); err != nil {
		return out, err
	}
	out.EmptyReason = resp.EmptyReason
	if resp.Lease != nil {
		if resp.LeaseAttestation == nil || *resp.LeaseAttestation == "" {
			return out, errors.New("client: claim response has a lease without lease_attestation")
		}
		out.Lease, out.attestation = resp.Lease, *resp.LeaseAttestation
	}
	return out, nil
}

func leasePath(leaseID uuid.UUID, suffix string) string {
	return "/sterile-cell-leases/" + leaseID.String() + suffix
}

// Validate checks a lease fence against the live lease and returns the lease
// (POST /v1/sterile-cell-leases/{id}/validate). A repeat changes nothing, so
// Validate retries like a read.
func (c *Client) Validate(ctx context.Context, leaseID uuid.UUID, proof wire.LeaseProof) (wire.Lease, error) {
	var resp wire.ValidateResponse
	err := c.do(ctx, request{method: http.MethodPost, path: leasePath(leaseID, "/validate"), body: proof, retry: true}, &resp)
	return resp.Lease, err
}

// Renew extends a live lease: its new expiry is the later of the current
// one and now + leaseSeconds, at most the cell's lifetime cap (POST
// /v1/sterile-cell-leases/{id}/renew, CONTRACT §20). The server clamps
// leaseSeconds into [1, its maximum lease] as a claim's; the answer is the
// lease with the expiry it got, which may be less than now + leaseSeconds
// (the cap) and is never earlier than before. The attestation does not
// change: proof stays valid. A wrong fence, or a lease no longer live
// (expired, released or revoked), is errcode.ErrConflict; an unknown or
// foreign lease errcode.ErrNotFound. Each renewal sets the expiry from its
// own now, so Renew retries like a read, with the same body.
// [Client.KeepAlive] renews a lease until it is stopped.
func (c *Client) Renew(ctx context.Context, leaseID uuid.UUID, proof wire.LeaseProof, leaseSeconds uint64) (wire.Lease, error) {
	var resp wire.RenewResponse
	body := wire.RenewRequest{LeaseProof: proof, LeaseSeconds: leaseSeconds}
	err := c.do(ctx, request{method: http.MethodPost, path: leasePath(leaseID, "/renew"), body: body, retry: true}, &resp)
	return resp.Lease, err
}

// Release records the tenant's stop of a pool cell with disposition d
// (lease.Destroyed or lease.Quarantined) and returns the status after the
// intent was recorded (POST /v1/sterile-cell-leases/{id}/release). The pool
// then tears the cell down; [Client.WaitProviderAbsent] waits for the proof.
// Release is sent once and never retried: after a lost response, read
// [Client.Lease] to learn whether the stop was recorded.
func (c *Client) Release(ctx context.Context, leaseID uuid.UUID, proof wire.LeaseProof, d lease.Disposition) (wire.LeaseStatus, error) {
	var resp wire.StatusResponse
	body := wire.ReleaseRequest{LeaseProof: proof, Disposition: d}
	err := c.do(ctx, request{method: http.MethodPost, path: leasePath(leaseID, "/release"), body: body}, &resp)
	return resp.Status, err
}

// Lease returns the status of a lease (GET /v1/sterile-cell-leases/{id}).
func (c *Client) Lease(ctx context.Context, leaseID uuid.UUID) (wire.LeaseStatus, error) {
	var resp wire.StatusResponse
	err := c.do(ctx, request{method: http.MethodGet, path: leasePath(leaseID, ""), retry: true}, &resp)
	return resp.Status, err
}

// DefaultPoll is the polling interval of [Client.WaitProviderAbsent] when it
// is given none.
const DefaultPoll = 500 * time.Millisecond

// WaitProviderAbsent polls the status of a lease every poll (DefaultPoll when
// poll <= 0) until the provider proved its cell gone (provider_absent), and
// returns that status. Transient failures (transport errors, 5xx) keep it
// polling; any other error ends it. When ctx ends first it returns the last
// status it read and an error wrapping ctx.Err().
func (c *Client) WaitProviderAbsent(ctx context.Context, leaseID uuid.UUID, poll time.Duration) (wire.LeaseStatus, error) {
	if poll <= 0 {
		poll = DefaultPoll
	}
	var last wire.LeaseStatus
	for {
		st, err := c.Lease(ctx, leaseID)
		switch {
		case err == nil && st.ProviderAbsent:
			return st, nil
		case err == nil:
			last = st
		case ctx.Err() != nil:
			return last, fmt.Errorf("client: waiting for provider_absent of lease %s: %w", leaseID, ctx.Err())
		case !transient(err):
			return last, err
		}
		if err := c.sleep(ctx, poll); err != nil {
			return last, fmt.Errorf("client: waiting for provider_absent of lease %s: %w", leaseID, err)
		}
	}
}

// Exec runs a command in the cell of a live lease and returns the raw answer
// (POST /v1/sterile-cell-leases/{id}/exec); [Client.Run] decodes it. Exec is
// sent once and never retried: a repeat would run the command again.
func (c *Client) Exec(ctx context.Context, leaseID uuid.UUID, req wire.ExecRequest) (wire.ExecResponse, error) {
	return c.exec(ctx, leaseID, req, "")
}

func (c *Client) exec(ctx context.Context, leaseID uuid.UUID, req wire.ExecRequest, key string) (wire.ExecResponse, error) {
	var resp wire.ExecResponse
	err := c.do(ctx, request{method: http.MethodPost, path: leasePath(leaseID, "/exec"), body: req, idempotencyKey: key}, &resp)
	return resp, err
}

// Command is one command for [Client.Run] and [Client.ExecStream].
type Command struct {
	// Argv is the program and its arguments (1 to 256 strings, each at
	// most 131071 bytes; argv and env entries KEY=value at most 1 MiB
	// together).
	Argv []string
	// Stdin is the command's standard input (at most 1 MiB).
	Stdin []byte
	// Env adds environment variables (at most 64).
	Env map[string]string
	// Cwd is the absolute working directory in the cell; empty means the
	// cell's home.
	Cwd string
	// User runs the command as wire.UserCell (empty too) or wire.UserRoot.
	User string
	// Timeout bounds the command, rounded up to whole seconds; zero means
	// the server's default (60 s). The lease bounds it too: at the lease's
	// expiry, which a renewal moves, the cell kills the command (reason
	// killed, with a Message saying so).
	Timeout time.Duration
	// IdempotencyKey, when set, is sent as the Idempotency-Key of Run: a
	// repeat of the same command with the same key (by the tenant token;
	// operators are not deduplicated) returns the first answer instead of
	// running the command again, so the caller can retry a lost answer.
	// ExecStream refuses it: a stream is never replayed.
	IdempotencyKey string
	// MaxOutputBytes caps each of stdout and stderr, in bytes, up to the
	// server's ceiling (SANDBOXWICH_EXEC_MAX_OUTPUT_CEILING_BYTES, default
	// 16 MiB; above it the server answers 422); zero means the server's
	// default cap (1 MiB unless configured). The server refuses more than
	// 1 MiB together with an IdempotencyKey (400 invalid_idempotency_key):
	// a stored answer keeps at most 1 MiB of each stream.
	MaxOutputBytes int
}

// Request returns the wire request of cmd under proof, as Run and
// ExecStream send it (for [Client.Exec]).
func (cmd Command) Request(proof wire.LeaseProof) (wire.ExecRequest, error) {
	req := wire.ExecRequest{LeaseProof: proof, Argv: cmd.Argv, Env: cmd.Env, Cwd: cmd.Cwd, User: cmd.User}
	if len(cmd.Stdin) > 0 {
		req.StdinBase64 = base64.StdEncoding.EncodeToString(cmd.Stdin)
	}
	if cmd.Timeout < 0 {
		return req, errors.New("client: negative command timeout")
	}
	if cmd.Timeout > 0 {
		s := uint64((cmd.Timeout + time.Second - 1) / time.Second)
		req.TimeoutSeconds = &s
	}
	switch {
	case cmd.MaxOutputBytes < 0:
		return req, errors.New("client: negative MaxOutputBytes")
	case cmd.MaxOutputBytes > 0:
		n := uint64(cmd.MaxOutputBytes)
		req.MaxOutputBytes = &n
	}
	return req, nil
}

// ExecResult is a finished command, decoded.
type ExecResult struct {
	// ExitCode is the child's code, or 128 + the signal number when a
	// signal ended it (137 at a timeout).
	ExitCode int
	// Stdout and Stderr are the output of Run; ExecStream hands it to its
	// callback instead.
	Stdout, Stderr []byte
	// Truncated reports that an output stream hit its cap, MaxOutputBytes.
	Truncated bool
	// MaxOutputBytes is the cap of each stream that applied, in bytes:
	// the command's, or the server's default (0 from a server that does
	// not report it).
	MaxOutputBytes int
	// TimedOut reports that the command was killed at its timeout.
	TimedOut bool
	// Signal names the signal that ended the command ("KILL"), or is "".
	Signal string
	// Reason is wire.ReasonExited, ReasonTimedOut or ReasonKilled (the
	// lease ended during the command). A cell that died is an error
	// instead: errcode.ErrConflict, the lease is over.
	Reason   string
	Duration time.Duration
	// Message says why a killed command was killed (its lease expired, or
	// was released or revoked); "" otherwise.
	Message string
}

// Run runs cmd in the cell of a live lease, like [Client.Exec], and decodes
// the answer. It is sent once and never retried; with cmd.IdempotencyKey
// the caller can repeat it safely.
func (c *Client) Run(ctx context.Context, leaseID uuid.UUID, proof wire.LeaseProof, cmd Command) (ExecResult, error) {
	req, err := cmd.Request(proof)
	if err != nil {
		return ExecResult{}, err
	}
	resp, err := c.exec(ctx, leaseID, req, cmd.IdempotencyKey)
	if err != nil {
		return ExecResult{}, err
	}
	return DecodeExec(resp)
}

// DecodeExec decodes the base64 streams of an exec answer.
func DecodeExec(r wire.ExecResponse) (ExecResult, error) {
	stdout, err := base64.StdEncoding.DecodeString(r.StdoutBase64)
	if err != nil {
		return ExecResult{}, fmt.Errorf("client: exec response: stdout_base64: %w", err)
	}
	stderr, err := base64.StdEncoding.DecodeString(r.StderrBase64)
	if err != nil {
		return ExecResult{}, fmt.Errorf("client: exec response: stderr_base64: %w", err)
	}
	res := exitResult(r.ExecExit)
	res.Stdout, res.Stderr = stdout, stderr
	return res, nil
}

// exitResult decodes how a command ended.
func exitResult(e wire.ExecExit) ExecResult {
	res := ExecResult{ExitCode: e.ExitCode, Truncated: e.Truncated, MaxOutputBytes: e.MaxOutputBytes, TimedOut: e.TimedOut,
		Reason: e.Reason, Duration: time.Duration(e.DurationMS) * time.Millisecond, Message: e.Message}
	if e.Signal != nil {
		res.Signal = *e.Signal
	}
	return res
}

// Pools returns every pool with its member counts (GET /v1/pools). It needs
// a tenant token and the operator token ([WithOperatorToken]).
func (c *Client) Pools(ctx context.Context) ([]wire.Pool, error) {
	var resp wire.PoolsResponse
	err := c.do(ctx, request{method: http.MethodGet, path: "/pools", retry: true}, &resp)
	return resp.Pools, err
}
