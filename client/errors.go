package client

import (
	"strconv"

	"github.com/sandboxwich/sandboxwich/errcode"
)

// Error is a non-2xx answer of the server. It matches the errcode sentinels
// of its Code under errors.Is (errors.Is(err, errcode.ErrConflict)), and
// errors.As finds an *errcode.Error with the same Code and Message in it.
type Error struct {
	// Status is the HTTP status code.
	Status int
	// Code is the wire error code. When the body was not a Sandboxwich
	// error (a proxy's error page, say) it is derived from Status.
	Code errcode.Code
	// Message is the server's message. Branch on Code, never on Message.
	Message string
	// RequestID is the x-request-id of the response, for the server's logs.
	RequestID string
	// RetryAfter is the Retry-After of the response, in seconds, or 0.
	RetryAfter int
}

// Error returns "code: message", like errcode.Error, followed by the HTTP
// status and request ID.
func (e *Error) Error() string {
	s := string(e.Code)
	if e.Message != "" {
		s += ": " + e.Message
	}
	s += " (HTTP " + strconv.Itoa(e.Status)
	if e.RequestID != "" {
		s += ", request " + e.RequestID
	}
	return s + ")"
}

// Unwrap returns an *errcode.Error with e's Code and Message, so that the
// errcode sentinels match e and errcode.CodeOf reports its code.
func (e *Error) Unwrap() error { return errcode.New(e.Code, e.Message) }
