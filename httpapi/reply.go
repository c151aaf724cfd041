package httpapi

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// statusError is a wire error answered with a status other than its code's
// default: 400 invalid_request for malformed JSON and bad path UUIDs.
type statusError struct {
	status int
	err    *errcode.Error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

// malformed returns a 400 invalid_request error.
func malformed(msg string) error {
	return &statusError{status: http.StatusBadRequest, err: errcode.New(errcode.InvalidRequest, msg)}
}

// invalid returns a 422 invalid_request error.
func invalid(msg string) error { return errcode.New(errcode.InvalidRequest, msg) }

var (
	errNotFound          = errcode.New(errcode.NotFound, "resource not found")
	errMethodNotAllowed  = errcode.New(errcode.MethodNotAllowed, "method not allowed")
	errAuthNotConfigured = errcode.New(errcode.AuthNotConfigured,
		"no authentication is configured: set tenant tokens, a shared token or worker tokens")
	errMediaType = errcode.New(errcode.UnsupportedMediaType, "the request body must be application/json")

	errHeaderTooLarge = errcode.New(errcode.RequestHeaderTooLarge, "the request header is larger than 64 KiB")
)

// tooLarge is the 413 of what exceeded limit bytes.
func tooLarge(what string, limit int64) error {
	return errcode.New(errcode.PayloadTooLarge, what+" is larger than "+strconv.FormatInt(limit>>20, 10)+" MiB")
}

// internalMessage is the only message a 500 internal answer carries.
const internalMessage = "internal server error"

// reply is a complete JSON response: what a handler answers and what an
// idempotency record stores.
type reply struct {
	status int
	body   []byte
	header http.Header // extra headers (Allow, Retry-After); may be nil
	// stored, when set, is the body an idempotency record keeps instead
	// of body (a JSON exec's output cut to its stored cap).
	stored []byte
}

// jsonReply encodes v as the body of a reply.
func jsonReply(status int, v any) (reply, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return reply{}, errcode.Wrap(errcode.Internal, "encode response", err)
	}
	return reply{status: status, body: b}, nil
}

// errorReply turns an error into the error envelope. Errors without a wire
// code, and internal ones, become 500 internal with a generic message; their
// cause is logged.
func (h *handler) errorReply(r *http.Request, err error) reply {
	rep := envelope(h.wireError(r, err))
	if rep.status == http.StatusServiceUnavailable || rep.status == http.StatusTooManyRequests {
		rep.header = http.Header{"Retry-After": {"1"}}
	}
	return rep
}

// wireError is the status, code and message err is answered with. Errors
// without a wire code, and internal ones, are 500 internal with a generic
// message; their cause is logged.
func (h *handler) wireError(r *http.Request, err error) (int, errcode.Code, string) {
	var se *statusError
	var ce *errcode.Error
	switch {
	case errors.As(err, &se):
		return se.status, se.err.Code, se.err.Message
	case errors.As(err, &ce) && ce.Code == errcode.StoreUnavailable:
		h.logCause(r, slog.LevelWarn, "httpapi: database unavailable", err)
		return ce.Code.HTTPStatus(), ce.Code, ce.Message
	case errors.As(err, &ce) && ce.Code != errcode.Internal:
		return ce.Code.HTTPStatus(), ce.Code, ce.Message
	}
	h.logInternal(r, err)
	return http.StatusInternalServerError, errcode.Internal, internalMessage
}

// internalReply is the answer to every internal error.
func internalReply() reply {
	return envelope(http.StatusInternalServerError, errcode.Internal, internalMessage)
}

// storedAnswer is implemented by answers whose idempotency record is cut
// down: storedForm returns the value to store, or nil to store the answer
// as sent.
type storedAnswer interface{ storedForm() any }

// envelope encodes the error envelope.
func envelope(status int, code errcode.Code, msg string) reply {
	if msg == "" {
		msg = string(code)
	}
	b, _ := json.Marshal(wire.ErrorResponse{OK: false, Code: string(code), Message: msg})
	return reply{status: status, body: b}
}

// logInternal logs the cause of an internal error (never a secret: causes
// are store and encoding errors, which do not carry request bodies).
func (h *handler) logInternal(r *http.Request, err error) {
	h.logCause(r, slog.LevelError, "httpapi: internal error", err)
}

// logCause logs err with its cause at level (info when the client went
// away).
func (h *handler) logCause(r *http.Request, level slog.Level, msg string, err error) {
	if r.Context().Err() != nil {
		level = slog.LevelInfo // the client went away
	}
	cause := err.Error()
	if ce, ok := errors.AsType[*errcode.Error](err); ok && ce.Err != nil {
		cause += ": " + ce.Err.Error()
	}
	h.log.LogAttrs(r.Context(), level, msg,
		slog.String("request_id", requestIDOf(r.Context())), slog.String("error", cause))
}

// write sends a reply.
func (h *handler) write(w http.ResponseWriter, rep reply) {
	hd := w.Header()
	for k, v := range rep.header {
		hd[k] = v
	}
	hd.Set("Content-Type", "application/json")
	hd.Set("Content-Length", strconv.Itoa(len(rep.body)))
	if hd.Get("Cache-Control") == "" {
		hd.Set("Cache-Control", "no-store") // claim bodies hold an attestation
	}
	w.WriteHeader(rep.status)
	_, _ = w.Write(rep.body)
}

// writeError sends the error envelope of err.
func (h *handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	h.write(w, h.errorReply(r, err))
}
