// Package errcode holds the error codes of the Sandboxwich wire contract and
// the error type that carries them through every layer.
//
// Each [Code] maps one-to-one to the "code" string of an error response. The
// sentinel errors below (ErrNotFound, ErrConflict, …) match any [*Error] of
// the same code under [errors.Is], so a caller can write
//
//	if errors.Is(err, errcode.ErrNotFound) { … }
//
// whether the error came from a store, the plane, or the HTTP client.
package errcode

import (
	"errors"
	"net/http"
)

// Code is a wire error code. Clients branch on it, never on messages.
type Code string

// The codes of CONTRACT §10.2.
const (
	BadRequest                     Code = "bad_request"
	InvalidRequest                 Code = "invalid_request"
	Unauthorized                   Code = "unauthorized"
	AuthorizationDenied            Code = "authorization_denied"
	NotFound                       Code = "not_found"
	MethodNotAllowed               Code = "method_not_allowed"
	Conflict                       Code = "conflict"
	ClaimContended                 Code = "sterile_cell_claim_contended"
	RuntimeClassBoundaryUnverified Code = "runtime_class_boundary_unverified"
	PayloadTooLarge                Code = "payload_too_large"
	UnsupportedMediaType           Code = "unsupported_media_type"
	Internal                       Code = "internal"
	AuthNotConfigured              Code = "auth_not_configured"
	InvalidIdempotencyKey          Code = "invalid_idempotency_key"
	IdempotencyKeyReused           Code = "idempotency_key_reused"
	IdempotencyInProgress          Code = "idempotency_in_progress"
	ExecUnsupported                Code = "exec_unsupported"

	// The codes CONTRACT §17 adds.

	// RequestHeaderTooLarge (431): a request header over the documented
	// limit.
	RequestHeaderTooLarge Code = "request_header_too_large"
	// CellAgentUnverified (409): the cell's agent did not report what a
	// sterile cell's agent must (waiting, never activated, its own cell,
	// the expected build), or refused the lease's fence. The cell is
	// quarantined.
	CellAgentUnverified Code = "cell_agent_unverified"
	// ImageDigestUnverified (409): the image the provider admitted is not
	// the one the pool pins. The cell is quarantined.
	ImageDigestUnverified Code = "image_digest_unverified"
	// UserUnsupported (422): the cell cannot run as the requested user.
	UserUnsupported Code = "user_unsupported"
	// FileNotFound (404): the file does not exist in the cell.
	FileNotFound Code = "file_not_found"
	// FileAccessDenied (403): permission denied, or a read-only file
	// system, in the cell.
	FileAccessDenied Code = "file_access_denied"
	// InsufficientStorage (507): no space left in the cell.
	InsufficientStorage Code = "insufficient_storage"
	// EventsExpired (410): the requested events are older than the log's
	// retention.
	EventsExpired Code = "events_expired"

	// StoreUnavailable (503, Retry-After): the database could not take the
	// operation (unreachable, restarting, out of space). An operation whose
	// connection broke during its commit may have committed: retry it as
	// it was (a claim under the same claim_id; the fence decides).
	StoreUnavailable Code = "store_unavailable"

	// TooManyRequests (429, Retry-After): the caller's token has as many
	// requests in flight as the server allows it
	// (SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL, CONTRACT §25).
	TooManyRequests Code = "too_many_requests"

	// ImageNotAllowed (422): no pool of the tenant whose release equals the
	// claim's has an image equal to, or images allowing, the claim's
	// image, or the image is a tag without a digest (CONTRACT §21).
	// Nothing is recorded.
	ImageNotAllowed Code = "image_not_allowed"
	// EgressNotAllowed (422): no candidate pool's egress policy covers the
	// claim's egress (CONTRACT §22). A malformed egress list is
	// InvalidRequest instead.
	EgressNotAllowed Code = "egress_not_allowed"
)

// statuses is the one table of codes and HTTP statuses: the status each
// code is answered with and, read the other way, the code an answer of a
// status is taken for when it carried none — the first code listed with
// that status. InvalidRequest is 422 (a well-formed body of the wrong
// shape); the HTTP layer answers 400 for malformed JSON and bad path UUIDs
// itself.
var statuses = [...]struct {
	code   Code
	status int
}{
	{BadRequest, http.StatusBadRequest},
	{InvalidRequest, http.StatusUnprocessableEntity},
	{Unauthorized, http.StatusUnauthorized},
	{AuthorizationDenied, http.StatusForbidden},
	{NotFound, http.StatusNotFound},
	{MethodNotAllowed, http.StatusMethodNotAllowed},
	{Conflict, http.StatusConflict},
	{ClaimContended, http.StatusConflict},
	{RuntimeClassBoundaryUnverified, http.StatusConflict},
	{PayloadTooLarge, http.StatusRequestEntityTooLarge},
	{UnsupportedMediaType, http.StatusUnsupportedMediaType},
	{Internal, http.StatusInternalServerError},
	{AuthNotConfigured, http.StatusInternalServerError},
	{InvalidIdempotencyKey, http.StatusBadRequest},
	{IdempotencyKeyReused, http.StatusConflict},
	{IdempotencyInProgress, http.StatusConflict},
	{ExecUnsupported, http.StatusNotImplemented},
	{RequestHeaderTooLarge, http.StatusRequestHeaderFieldsTooLarge},
	{CellAgentUnverified, http.StatusConflict},
	{ImageDigestUnverified, http.StatusConflict},
	{UserUnsupported, http.StatusUnprocessableEntity},
	{FileNotFound, http.StatusNotFound},
	{FileAccessDenied, http.StatusForbidden},
	{InsufficientStorage, http.StatusInsufficientStorage},
	{EventsExpired, http.StatusGone},
	{StoreUnavailable, http.StatusServiceUnavailable},
	{TooManyRequests, http.StatusTooManyRequests},
	{ImageNotAllowed, http.StatusUnprocessableEntity},
	{EgressNotAllowed, http.StatusUnprocessableEntity},
}

// HTTPStatus is the status a code is answered with; 500 for a code this
// package does not define.
func (c Code) HTTPStatus() int {
	for _, e := range statuses {
		if e.code == c {
			return e.status
		}
	}
	return http.StatusInternalServerError
}

// ForStatus is the code an error answer of status that carried no code (a
// proxy's error page) is taken for: the code answered with that status, or
// where several are, the general one (bad_request, invalid_request,
// authorization_denied, not_found, conflict, internal); internal for a
// status no code is answered with.
func ForStatus(status int) Code {
	for _, e := range statuses {
		if e.status == status {
			return e.code
		}
	}
	return Internal
}

// Error is an error with a wire code. Message is safe to show to the caller:
// it never holds secrets or internals. Err, when set, is the underlying cause
// for logs and errors.Is/As; it is not part of the wire message.
type Error struct {
	Code    Code
	Message string
	Err     error
}

// Error returns the message, prefixed by the code.
func (e *Error) Error() string {
	if e.Message == "" {
		return string(e.Code)
	}
	return string(e.Code) + ": " + e.Message
}

// Unwrap returns the underlying cause.
func (e *Error) Unwrap() error { return e.Err }

// Is reports whether target is an *Error with the same code, so that the
// sentinels match every error of their code.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code == e.Code && t.Message == "" && t.Err == nil
}

// New returns an *Error with the given code and message.
func New(code Code, message string) *Error { return &Error{Code: code, Message: message} }

// Wrap returns an *Error with the given code and message whose cause is err.
func Wrap(code Code, message string, err error) *Error {
	return &Error{Code: code, Message: message, Err: err}
}

// CodeOf returns the code of the first *Error in err's chain, or Internal.
func CodeOf(err error) Code {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.Code
	}
	return Internal
}

// Sentinels, one per code, for errors.Is.
var (
	ErrBadRequest                     = &Error{Code: BadRequest}
	ErrInvalidRequest                 = &Error{Code: InvalidRequest}
	ErrUnauthorized                   = &Error{Code: Unauthorized}
	ErrAuthorizationDenied            = &Error{Code: AuthorizationDenied}
	ErrNotFound                       = &Error{Code: NotFound}
	ErrMethodNotAllowed               = &Error{Code: MethodNotAllowed}
	ErrConflict                       = &Error{Code: Conflict}
	ErrClaimContended                 = &Error{Code: ClaimContended}
	ErrRuntimeClassBoundaryUnverified = &Error{Code: RuntimeClassBoundaryUnverified}
	ErrPayloadTooLarge                = &Error{Code: PayloadTooLarge}
	ErrUnsupportedMediaType           = &Error{Code: UnsupportedMediaType}
	ErrInternal                       = &Error{Code: Internal}
	ErrAuthNotConfigured              = &Error{Code: AuthNotConfigured}
	ErrInvalidIdempotencyKey          = &Error{Code: InvalidIdempotencyKey}
	ErrIdempotencyKeyReused           = &Error{Code: IdempotencyKeyReused}
	ErrIdempotencyInProgress          = &Error{Code: IdempotencyInProgress}
	ErrExecUnsupported                = &Error{Code: ExecUnsupported}
	ErrRequestHeaderTooLarge          = &Error{Code: RequestHeaderTooLarge}
	ErrCellAgentUnverified            = &Error{Code: CellAgentUnverified}
	ErrImageDigestUnverified          = &Error{Code: ImageDigestUnverified}
	ErrUserUnsupported                = &Error{Code: UserUnsupported}
	ErrFileNotFound                   = &Error{Code: FileNotFound}
	ErrFileAccessDenied               = &Error{Code: FileAccessDenied}
	ErrInsufficientStorage            = &Error{Code: InsufficientStorage}
	ErrEventsExpired                  = &Error{Code: EventsExpired}
	ErrStoreUnavailable               = &Error{Code: StoreUnavailable}
	ErrTooManyRequests                = &Error{Code: TooManyRequests}
	ErrImageNotAllowed                = &Error{Code: ImageNotAllowed}
	ErrEgressNotAllowed               = &Error{Code: EgressNotAllowed}
)
