package errcode

import (
	"errors"
	"fmt"
	"net/http"
	"testing"
)

func TestSentinelsMatchByCode(t *testing.T) {
	err := fmt.Errorf("wrapped: %w", Wrap(Conflict, "lease is no longer live", errors.New("cause")))
	if !errors.Is(err, ErrConflict) || errors.Is(err, ErrNotFound) {
		t.Fatal("errors.Is by code")
	}
	if CodeOf(err) != Conflict || CodeOf(errors.New("x")) != Internal {
		t.Fatal("CodeOf")
	}
	if errors.Is(ErrConflict, New(Conflict, "specific")) {
		t.Fatal("a sentinel must not match a specific error")
	}
}

func TestHTTPStatus(t *testing.T) {
	for code, status := range map[Code]int{
		BadRequest: 400, InvalidRequest: 422, Unauthorized: 401, AuthorizationDenied: 403, NotFound: 404,
		MethodNotAllowed: 405, Conflict: 409, ClaimContended: 409, RuntimeClassBoundaryUnverified: 409,
		PayloadTooLarge: 413, UnsupportedMediaType: 415, Internal: 500, AuthNotConfigured: 500,
		InvalidIdempotencyKey: 400, IdempotencyKeyReused: 409, IdempotencyInProgress: 409,
		ExecUnsupported: http.StatusNotImplemented, RequestHeaderTooLarge: 431,
		CellAgentUnverified: 409, ImageDigestUnverified: 409, UserUnsupported: 422, FileNotFound: 404,
		FileAccessDenied: 403, InsufficientStorage: 507, EventsExpired: 410, StoreUnavailable: 503,
		TooManyRequests: 429, ImageNotAllowed: 422, EgressNotAllowed: 422,
	} {
		if got := code.HTTPStatus(); got != status {
			t.Errorf("%s: %d, want %d", code, got, status)
		}
	}
}

// TestForStatus: the inverse of HTTPStatus, read from the same table: a
// status answered for one code only gives that code back; a status shared
// by several gives the general one; any other status is internal.
func TestForStatus(t *testing.T) {
	byStatus := map[int][]Code{}
	for _, e := range statuses {
		byStatus[e.status] = append(byStatus[e.status], e.code)
	}
	for _, e := range statuses {
		if len(byStatus[e.status]) == 1 && ForStatus(e.code.HTTPStatus()) != e.code {
			t.Errorf("%s does not round-trip: %d gives %s", e.code, e.status, ForStatus(e.status))
		}
	}
	for status, code := range map[int]Code{400: BadRequest, 403: AuthorizationDenied, 404: NotFound, 409: Conflict,
		422: InvalidRequest, 500: Internal, 502: Internal, 418: Internal} {
		if got := ForStatus(status); got != code {
			t.Errorf("ForStatus(%d) = %s, want %s", status, got, code)
		}
	}
	if len(statuses) != 29 {
		t.Errorf("the table holds %d codes; a new code needs its status here", len(statuses))
	}
}
