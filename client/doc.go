// Package client is the Go client of the Sandboxwich /v1 HTTP API: claim a
// sterile cell, validate, exec in (with the output streamed as it comes, or
// at the end), launch its resident workload, write and read its files and
// release its lease, read lease status and pools, and (for external
// workers) prepare, read, retire and destroy cells.
//
// Start with [New]: the server's base URL and a tenant token ([WithToken]).
// [Client.Claim] leases a cell and returns a [Claim], whose [Claim.Proof] is
// the lease fence every later call presents: [Client.Validate],
// [Client.Run] (or [Client.Exec]) and [Client.Release]; after a release,
// [Client.WaitProviderAbsent] returns once the provider proved the cell
// deleted. ExampleClient_Claim is that whole life cycle. A lease longer
// than the server's maximum lease length is kept alive with
// [Client.Renew], or [Client.KeepAlive] that renews it in the background
// until it is stopped.
//
// It imports only the wire types ([wire], [errcode], [lease]), never the
// server.
//
// # Fenced claims retry safely
//
// A claim is the one call that must survive a lost response: the server may
// have leased a cell and then the connection dropped. [Client.Claim] therefore
// always sends a claim_id. When the caller gives none it generates a UUIDv7,
// marshals the request body once, and retries transport errors, 5xx answers
// (500, 502, 503, 504, …; not 501), 429 and 409 sterile_cell_claim_contended
// with the same claim_id and byte-identical body, with exponential backoff and
// full jitter (Retry-After is honoured), until an answer arrives, the attempts
// run out ([WithRetry]) or ctx is done. Other 4xx answers are never retried.
//
// The server fences every claim on (tenant, claim_id): a retry whose first
// attempt did lease a cell gets the same lease and a byte-identical
// attestation back, and a retry whose first attempt found nothing gets the
// same empty answer. A retry never leases a second cell:
//
//	c, err := cl.Claim(ctx, req) // attempt 1 leases cell X; the response is lost
//	                             // attempt 2 (same claim_id) answers: lease on cell X
//
// The claim ID is in the returned [Claim] even when Claim fails, so a caller
// whose retries ran out can try again later — with the same ClaimID in the
// request — and still get the one lease, never a second cell. An answer
// that the fence refuses (409 conflict: the lease expired or ended, or the
// request differs) is final.
//
// # Other calls
//
// Reads (Lease, ListLeases and Leases, Inventory, Evidence, LaunchStatus,
// Images, Pools, WorkerCell), Validate, Renew, Prefetch and ReadFile retry
// like a claim, since repeating them changes nothing (ReadFile until the
// content starts; a renewal sets the expiry from its own now, never twice
// the extension; a prefetch never pulls an image in flight twice).
// Launch retries too: the server launches once per lease and answers an
// exact repeat with the launch already made, so a retry after a lost answer
// never starts a second workload. The other mutating calls (Release,
// Revoke, Exec, Run, ExecStream, WriteFile, Prepare, Retire, Destroy) are
// sent exactly once and never retried automatically: after a lost response
// their outcome is unknown, and a blind repeat is not always harmless — an
// exec would run its command twice, a file's content reader is consumed by
// the first attempt, a prepare would be refused as a reused cell ID, and a
// release repeated after the stop completed fails the lease fence ("no
// longer live") although the first one succeeded. Resolve
// such an ambiguity with a read ([Client.Lease] for a release,
// [Client.WorkerCell] for the worker calls) and decide; give [Client.Run]
// a [Command.IdempotencyKey] to repeat a command safely (a streamed exec
// cannot be replayed, so ExecStream refuses one).
//
// # Worker calls
//
// [Client.Prepare], [Client.WorkerCell], [Client.Retire] and
// [Client.Destroy] are the calls of an external worker that manages its own
// provider. Make them with a worker token (sbw_wtok_…, [WithToken]) whose
// worker ID is the workerID argument; any other worker's cell is not_found.
//
// # Errors
//
// Every non-2xx answer is an [*Error] carrying the HTTP status, the wire code,
// the server's message and its request ID. It matches the errcode sentinels
// under [errors.Is], and [errors.As] finds an [*errcode.Error] in it:
//
//	if errors.Is(err, errcode.ErrConflict) { … }
//
// # Secrets
//
// The lease attestation is a bearer secret for the claimer alone. [Claim]
// keeps it in an unexported field, read with [Claim.Attestation]; printing a
// Claim with any fmt verb, logging it with log/slog, or encoding it as JSON
// never shows it. No error of this package contains an attestation or a
// token: request bodies are never quoted in errors.
package client
