package httpapi

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Request headers handled by the middleware.
const (
	RequestIDHeader   = "x-request-id"
	TraceparentHeader = "traceparent"
	maxRequestIDLen   = 128
)

// MaxHeaderBytes bounds a request's header: its request line, Host and
// every header line, CRLFs included. A larger header is answered 431
// request_header_too_large. An http.Server serving the handler must set
// its own MaxHeaderBytes well above this, or Go answers a plain-text 431
// before the handler runs.
const MaxHeaderBytes = 64 << 10

// unmatchedRoute labels requests that match no route.
const unmatchedRoute = "unmatched"

// reqState is the per-request state the middleware shares with the route.
type reqState struct {
	id    string
	route string
}

type stateKey struct{}

func stateOf(ctx context.Context) *reqState {
	st, _ := ctx.Value(stateKey{}).(*reqState)
	return st
}

// requestIDOf returns the request's x-request-id.
func requestIDOf(ctx context.Context) string {
	if st := stateOf(ctx); st != nil {
		return st.id
	}
	return ""
}

// setRoute records the matched route's pattern for logs and metrics.
func setRoute(ctx context.Context, pattern string) {
	if st := stateOf(ctx); st != nil {
		st.route = pattern
	}
}

// middleware sets x-request-id and traceparent on every response, answers
// a header over MaxHeaderBytes with 431 and a token's request beyond its
// in-flight cap with 429 (Retry-After), recovers panics into 500
// internal, and logs and counts every request.
func (h *handler) middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		st := &reqState{id: requestID(r.Header.Get(RequestIDHeader)), route: unmatchedRoute}
		w.Header().Set(RequestIDHeader, st.id)
		if tp := r.Header.Get(TraceparentHeader); validTraceparent(tp) {
			w.Header().Set(TraceparentHeader, tp)
		}
		r = r.WithContext(context.WithValue(r.Context(), stateKey{}, st))
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			v := recover()
			if v != nil && v != http.ErrAbortHandler {
				h.log.LogAttrs(r.Context(), slog.LevelError, "httpapi: panic",
					slog.String("request_id", st.id), slog.String("panic", fmt.Sprint(v)))
				if sw.status == 0 {
					h.write(sw, internalReply())
				}
			}
			h.observe(r, st, sw.code(), time.Since(start))
			if v == http.ErrAbortHandler {
				panic(v)
			}
		}()
		if headerBytes(r) > MaxHeaderBytes {
			h.writeError(sw, r, errHeaderTooLarge)
			return
		}
		done, ok := h.inflight.acquire(r)
		if !ok {
			h.writeError(sw, r, errTooManyRequests)
			return
		}
		defer done()
		next.ServeHTTP(sw, r)
	})
}

// headerBytes is the size of a request's header as sent: the request line,
// Host and every header line, each with its CRLF.
func headerBytes(r *http.Request) int {
	n := len(r.Method) + 1 + len(r.RequestURI) + 1 + len(r.Proto) + 2 + len("Host: ") + len(r.Host) + 2
	for k, vs := range r.Header {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + 2
		}
	}
	return n
}

// observe logs a finished request and records its metrics.
func (h *handler) observe(r *http.Request, st *reqState, status int, d time.Duration) {
	code := strconv.Itoa(status)
	h.metrics.requests.WithLabelValues(st.route, code).Inc()
	h.metrics.latency.WithLabelValues(st.route, code).Observe(d.Seconds())
	h.log.LogAttrs(r.Context(), slog.LevelInfo, "http request",
		slog.String("method", r.Method),
		slog.String("route", st.route),
		slog.Int("status", status),
		slog.Duration("duration", d),
		slog.String("request_id", st.id))
}

// requestID returns a non-blank incoming request ID of at most 128
// printable ASCII characters, or a new UUIDv7.
func requestID(in string) string {
	in = strings.TrimSpace(in)
	if in != "" && len(in) <= maxRequestIDLen && printableASCII(in) {
		return in
	}
	return uuid.Must(uuid.NewV7()).String()
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// validTraceparent reports whether s is a W3C traceparent:
// version-traceid-parentid-flags in lowercase hex, version not ff, ids not
// all zero. Version 00 has exactly these four fields; later versions may
// append "-…".
func validTraceparent(s string) bool {
	if len(s) < 55 || (len(s) > 55 && (s[55] != '-' || s[:2] == "00")) {
		return false
	}
	f := strings.Split(s[:55], "-")
	if len(f) != 4 || len(f[0]) != 2 || len(f[1]) != 32 || len(f[2]) != 16 || len(f[3]) != 2 {
		return false
	}
	for _, p := range f {
		if !lowerHex(p) {
			return false
		}
	}
	return f[0] != "ff" && strings.Trim(f[1], "0") != "" && strings.Trim(f[2], "0") != ""
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// statusWriter records the status a handler sent.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	if w.status == 0 {
		w.status = status
	}
	w.ResponseWriter.WriteHeader(status)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// code is the status sent, 200 when the handler wrote nothing.
func (w *statusWriter) code() int {
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}
