// Package httpapi is the mountable [http.Handler] of the Sandboxwich /v1
// wire contract: the tenant, worker and operator routes of sterile cells,
// health and readiness probes, Prometheus metrics and the OpenAPI document.
//
// Every route is served under /v1/... and at its unversioned alias
// (/v1/sterile-cells/claim and /sterile-cells/claim; /healthz and
// /v1/healthz). The route table in routes.go is the single list of what the
// handler serves; the embedded OpenAPI document (see [OpenAPI]) describes
// exactly those routes, and a test keeps the two in step.
//
// Errors are always the JSON envelope {"ok":false,"code":"…","message":"…"}
// with the status of the code (package errcode), including unknown paths
// (404 not_found), wrong methods (405 method_not_allowed, with Allow) and
// headers over [MaxHeaderBytes] (431 request_header_too_large) — except
// once a streamed exec (Accept: text/event-stream) has committed its
// answer: a failure after that is an error event with the same code and
// message, and the stream ends.
// Every response carries x-request-id; a valid W3C traceparent is echoed.
//
// Secrets (bearer tokens, the operator token, lease attestations, request
// bodies) are never logged, at any level, and never appear in error messages.
package httpapi

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sandboxwich/sandboxwich"
)

// Auth configures the principals of CONTRACT §10.1. Tokens are compared in
// constant time; none of them is ever logged.
//
// With no tenant token, no shared token, no worker and AllowInsecureNoAuth
// off, the handler fails closed: /healthz answers 200, /readyz 503 and every
// other route 500 auth_not_configured.
type Auth struct {
	// TenantTokens maps a bearer token to the tenant it acts for.
	TenantTokens map[string]string
	// SharedToken is one bearer token that always acts for DefaultTenant.
	SharedToken string
	// DefaultTenant is the tenant of SharedToken and of unauthenticated
	// requests under AllowInsecureNoAuth (default "default").
	DefaultTenant string
	// OperatorToken, presented in the x-sandboxwich-operator-token header
	// next to a tenant bearer token, makes the caller an operator of that
	// tenant. Empty disables operators.
	OperatorToken string
	// Workers maps a worker bearer token (sbw_wtok_…) to its worker.
	Workers map[string]sandboxwich.Worker
	// AllowInsecureNoAuth lets a request without an Authorization header act
	// as a tenant of DefaultTenant. For local development only; New logs a
	// warning when it is set. A request that does present a token must still
	// present a valid one.
	AllowInsecureNoAuth bool
}

// Config configures the handler returned by [New].
type Config struct {
	// Plane runs the sterile-cell operations. Required.
	Plane *sandboxwich.Plane
	// Auth configures tokens and principals.
	Auth Auth
	// Logger receives one Info line per request and the causes of internal
	// errors (default slog.Default).
	Logger *slog.Logger
	// Registry receives the handler's Prometheus collectors; nil → a new
	// one, which also holds the Go runtime and process collectors. /metrics serves it. It must not already hold the collectors of
	// another handler.
	Registry *prometheus.Registry
	// MetricsPublic serves /metrics without a token.
	MetricsPublic bool
	// StreamKeepAlive is the interval of the keep-alive comments of a
	// streamed exec and of the event stream (default
	// DefaultStreamKeepAlive, 15 s).
	StreamKeepAlive time.Duration
	// EventPoll is how often the event stream looks for new events while
	// any stream is open (default DefaultEventPoll, 100 ms): one read of
	// the log's newest id for all streams of the handler.
	EventPoll time.Duration
	// StreamsDone, when closed, ends every event stream of GET /v1/events
	// (which otherwise lasts until the client goes): a server shutting
	// down closes it, as http.Server.Shutdown waits for its handlers.
	// Clients reconnect with Last-Event-ID.
	StreamsDone <-chan struct{}
	// Collectors are registered with the handler's registry too (the
	// webhook deliverer's metrics).
	Collectors []prometheus.Collector
	// UploadIdleTimeout bounds a file write once its proof is checked and
	// its lease found: the connection is cut when no content arrives for
	// this long (default DefaultUploadIdleTimeout). Before that point the
	// http.Server's ReadTimeout bounds the request like any other; the
	// lease's expiry bounds the whole upload.
	UploadIdleTimeout time.Duration
	// MaxRequestsPerPrincipal caps the requests in flight per bearer token
	// (CONTRACT §25, SANDBOXWICH_MAX_REQUESTS_PER_PRINCIPAL): one more is
	// answered 429 too_many_requests with Retry-After. Zero means
	// DefaultMaxRequestsPerPrincipal; negative means no cap.
	MaxRequestsPerPrincipal int
}

// DefaultUploadIdleTimeout is the default of Config.UploadIdleTimeout.
const DefaultUploadIdleTimeout = time.Minute

// DefaultMaxRequestsPerPrincipal is the default of
// Config.MaxRequestsPerPrincipal.
const DefaultMaxRequestsPerPrincipal = 512

// DefaultStreamKeepAlive is the default of Config.StreamKeepAlive.
const DefaultStreamKeepAlive = 15 * time.Second

// handler is the http.Handler returned by New.
type handler struct {
	plane   *sandboxwich.Plane
	auth    *authenticator
	log     *slog.Logger
	metrics *metrics
	reg     *prometheus.Registry
	promh   http.Handler
	public  bool
	mux     *http.ServeMux
	// keepAlive is the interval of an event stream's keep-alive comments.
	keepAlive time.Duration
	// hub keeps the log's tail for the streams of GET /v1/events and
	// wakes them when it grows.
	hub *eventHub
	// streamsDone ends them (Config.StreamsDone); nil never does.
	streamsDone <-chan struct{}
	// uploadIdle is Config.UploadIdleTimeout.
	uploadIdle time.Duration
	// inflight counts the requests in flight per token.
	inflight *inflight
}

// New returns the handler of the /v1 contract over cfg.Plane. It fails on a
// missing plane, an inconsistent token configuration (an empty token, a
// token configured twice, an operator token equal to a tenant, shared or
// worker token, a worker token without the sbw_wtok_ prefix, a
// worker without ID or tenant) or a registry that already holds the
// handler's collectors.
func New(cfg Config) (http.Handler, error) {
	if cfg.Plane == nil {
		return nil, errors.New("httpapi: Config.Plane is required")
	}
	h := &handler{
		plane:  cfg.Plane,
		log:    cfg.Logger,
		reg:    cfg.Registry,
		public: cfg.MetricsPublic,

		keepAlive: cfg.StreamKeepAlive,
	}
	if h.keepAlive <= 0 {
		h.keepAlive = DefaultStreamKeepAlive
	}
	poll := cfg.EventPoll
	if poll <= 0 {
		poll = DefaultEventPoll
	}
	h.hub = newEventHub(cfg.Plane, poll)
	h.uploadIdle = cfg.UploadIdleTimeout
	if h.uploadIdle <= 0 {
		h.uploadIdle = DefaultUploadIdleTimeout
	}
	switch limit := cfg.MaxRequestsPerPrincipal; {
	case limit == 0:
		h.inflight = newInflight(DefaultMaxRequestsPerPrincipal)
	case limit > 0:
		h.inflight = newInflight(limit)
	}
	h.streamsDone = cfg.StreamsDone
	if h.log == nil {
		h.log = slog.Default()
	}
	if h.reg == nil {
		h.reg = prometheus.NewRegistry()
		// A registry of its own also reports the process: goroutines,
		// memory, file descriptors.
		h.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	var err error
	if h.auth, err = newAuthenticator(cfg.Auth); err != nil {
		return nil, err
	}
	if h.metrics, err = newMetrics(h.reg, cfg.Plane); err != nil {
		return nil, err
	}
	for _, c := range cfg.Collectors {
		if err := h.reg.Register(c); err != nil {
			return nil, fmt.Errorf("httpapi: register a collector: %w", err)
		}
	}
	h.promh = newPromHandler(h.reg, h.log)
	h.mux = h.newMux()
	h.warnAuthMode()
	return h.middleware(http.HandlerFunc(h.dispatch)), nil
}

// warnAuthMode logs, once, a handler that is open or fails closed.
func (h *handler) warnAuthMode() {
	switch {
	case h.auth.insecure:
		h.log.Warn("httpapi: INSECURE: AllowInsecureNoAuth is set; requests without a token act as tenant " +
			h.auth.defaultTenant + ". Never use this outside local development.")
	case !h.auth.configured():
		h.log.Warn("httpapi: no authentication configured; every route but /healthz and /readyz " +
			"answers 500 auth_not_configured")
	}
}

// newMux registers every route of the table at its path and its alias.
func (h *handler) newMux() *http.ServeMux {
	mux := http.NewServeMux()
	for i := range routes {
		rt := &routes[i]
		serve := h.serveRoute(rt)
		for _, p := range rt.paths() {
			mux.Handle(rt.method+" "+p, serve)
		}
	}
	return mux
}

// dispatch serves a request through the mux, answering unmatched requests
// with the JSON envelope (404, or 405 with Allow).
func (h *handler) dispatch(w http.ResponseWriter, r *http.Request) {
	mh, pattern := h.mux.Handler(r)
	if pattern != "" {
		h.mux.ServeHTTP(w, r) // sets the path values mh would lack
		return
	}
	if !h.auth.configured() {
		h.writeError(w, r, errAuthNotConfigured)
		return
	}
	cw := &captureWriter{header: http.Header{}}
	mh.ServeHTTP(cw, r)
	if cw.status == http.StatusMethodNotAllowed {
		if allow := cw.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		h.writeError(w, r, errMethodNotAllowed)
		return
	}
	h.writeError(w, r, errNotFound)
}

// captureWriter records the status and headers the mux's own 404 and 405
// handlers set, and drops their text bodies.
type captureWriter struct {
	header http.Header
	status int
}

func (c *captureWriter) Header() http.Header         { return c.header }
func (c *captureWriter) Write(b []byte) (int, error) { return len(b), nil }
func (c *captureWriter) WriteHeader(status int)      { c.status = status }
