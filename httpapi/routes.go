package httpapi

import (
	"net/http"
	"strings"
)

// access is the class of principal a route admits.
type access int

const (
	// accessProbe: no token, served even when no authentication is
	// configured (/healthz, /readyz).
	accessProbe access = iota
	// accessPublic: no token (the OpenAPI document).
	accessPublic
	// accessMetrics: a tenant or operator token, or none when metrics are
	// public.
	accessMetrics
	// accessTenant: a tenant token, with or without the operator header.
	accessTenant
	// accessLease: any principal of the tenant: tenant, operator or worker.
	accessLease
	// accessWorker: the worker whose ID is the {worker_id} path segment.
	accessWorker
	// accessOperator: a tenant token with the operator header.
	accessOperator
)

// idemMode is how a route takes part in Idempotency-Key.
type idemMode int

const (
	// idemNone: the header is ignored.
	idemNone idemMode = iota
	// idemReplay: completed responses are stored and replayed, except 429
	// and 5xx.
	idemReplay
	// idemErrorsOnly: like idemReplay, but successful responses are never
	// stored (the claim: its claim_id fence makes a re-execution return the
	// same lease, and its body holds an attestation).
	idemErrorsOnly
	// idemRefused: the route streams its answer, which is never stored; a
	// key is refused with 400 invalid_idempotency_key (the file routes).
	idemRefused
)

// jsonFunc serves a JSON route: it returns the success status and body, or
// an error that becomes the error envelope.
type jsonFunc func(h *handler, c *call) (int, any, error)

// route is one entry of the route table.
type route struct {
	method string
	// path is the canonical path, as written in the OpenAPI document. The
	// handler also serves its alias (see paths).
	path   string
	access access
	// body marks routes that read a JSON request body (415, 413).
	body bool
	// optBody marks routes whose JSON body may be left out: a request
	// without one (Content-Length 0) needs no Content-Type.
	optBody bool
	// maxBody bounds that body; zero means MaxBodyBytes.
	maxBody int64
	// upload marks a route whose multipart/form-data body its stream
	// function reads itself, part by part.
	upload bool
	// idem is how the route honours Idempotency-Key for the tenant
	// principal (CONTRACT §10.4).
	idem idemMode
	// keyCheck, when set, refuses an Idempotency-Key for some requests of
	// an idemReplay route, before any record of the key is made.
	keyCheck func(c *call) error
	// serve answers JSON routes; raw answers the others.
	serve jsonFunc
	raw   func(h *handler, w http.ResponseWriter, r *http.Request)
	// stream writes the route's own answer (an event stream, a file's
	// bytes) after the body was read; an Idempotency-Key is refused. On a
	// route that also has serve, it answers the requests that accept
	// text/event-stream.
	stream func(h *handler, c *call, w http.ResponseWriter)
}

// routes is the route table: every route the handler serves, once.
var routes = []route{
	{method: http.MethodPost, path: "/v1/sterile-cells/claim", access: accessTenant, body: true, idem: idemErrorsOnly, serve: (*handler).claim},
	{method: http.MethodPost, path: "/v1/sterile-cell-leases/{lease_id}/validate", access: accessLease, body: true, serve: (*handler).validate},
	{method: http.MethodPost, path: "/v1/sterile-cell-leases/{lease_id}/release", access: accessTenant, body: true, idem: idemReplay, serve: (*handler).release},
	{method: http.MethodPost, path: "/v1/sterile-cell-leases/{lease_id}/renew", access: accessTenant, body: true, idem: idemReplay, serve: (*handler).renew},
	{method: http.MethodGet, path: "/v1/sterile-cell-leases/{lease_id}", access: accessTenant, serve: (*handler).leaseStatus},
	{method: http.MethodPost, path: "/v1/sterile-cell-leases/{lease_id}/exec", access: accessTenant, body: true, maxBody: MaxExecBodyBytes, idem: idemReplay, keyCheck: execKeyCheck, serve: (*handler).exec, stream: (*handler).execStream},
	{method: http.MethodPost, path: "/v1/sterile-cell-leases/{lease_id}/launch", access: accessTenant, body: true, idem: idemReplay, serve: (*handler).launch},
	{method: http.MethodGet, path: "/v1/sterile-cell-leases/{lease_id}/launch", access: accessTenant, serve: (*handler).launchStatus},
	{method: http.MethodPost, path: "/v1/sterile-cell-leases/{lease_id}/files/write", access: accessTenant, upload: true, idem: idemRefused, stream: (*handler).writeFile},
	{method: http.MethodPost, path: "/v1/sterile-cell-leases/{lease_id}/files/read", access: accessTenant, body: true, idem: idemRefused, stream: (*handler).readFile},
	{method: http.MethodGet, path: "/v1/sterile-cell-leases", access: accessTenant, serve: (*handler).listLeases},
	{method: http.MethodPost, path: "/v1/sterile-cell-leases/{lease_id}/revoke", access: accessTenant, optBody: true, idem: idemReplay, serve: (*handler).revoke},
	{method: http.MethodGet, path: "/v1/sterile-cell-leases/{lease_id}/evidence", access: accessTenant, serve: (*handler).evidence},
	{method: http.MethodGet, path: "/v1/sterile-cell-leases/{lease_id}/egress", access: accessTenant, serve: (*handler).egressCounts},
	{method: http.MethodGet, path: "/v1/sterile-cells/inventory", access: accessTenant, serve: (*handler).inventory},
	{method: http.MethodPost, path: "/v1/images/prefetch", access: accessTenant, body: true, serve: (*handler).prefetch},
	{method: http.MethodGet, path: "/v1/images", access: accessTenant, serve: (*handler).listImages},
	{method: http.MethodPost, path: "/v1/workers/{worker_id}/sterile-cells/prepare", access: accessWorker, body: true, serve: (*handler).prepare},
	{method: http.MethodGet, path: "/v1/workers/{worker_id}/sterile-cells/{cell_id}", access: accessWorker, serve: (*handler).workerCell},
	{method: http.MethodPost, path: "/v1/workers/{worker_id}/sterile-cells/{cell_id}/retire", access: accessWorker, body: true, serve: (*handler).retire},
	{method: http.MethodPost, path: "/v1/workers/{worker_id}/sterile-cells/{cell_id}/destroy", access: accessWorker, body: true, serve: (*handler).destroy},
	{method: http.MethodPost, path: "/v1/workers/{worker_id}/sterile-cells/{cell_id}/release", access: accessWorker, body: true, serve: (*handler).releasePoolCell},
	{method: http.MethodGet, path: "/v1/pools", access: accessOperator, serve: (*handler).listPools},
	{method: http.MethodGet, path: "/v1/events", access: accessTenant, idem: idemRefused, stream: (*handler).events},
	{method: http.MethodGet, path: "/v1/webhooks/deliveries", access: accessOperator, serve: (*handler).webhookDeliveries},
	{method: http.MethodGet, path: "/v1/openapi.json", access: accessPublic, raw: (*handler).openAPI},
	{method: http.MethodGet, path: "/healthz", access: accessProbe, raw: (*handler).healthz},
	{method: http.MethodGet, path: "/readyz", access: accessProbe, raw: (*handler).readyz},
	{method: http.MethodGet, path: "/metrics", access: accessMetrics, raw: (*handler).serveMetrics},
}

// bodyLimit is the largest JSON body the route reads.
func (rt *route) bodyLimit() int64 {
	if rt.maxBody > 0 {
		return rt.maxBody
	}
	return MaxBodyBytes
}

// streams reports whether the route's stream function answers r.
func (rt *route) streams(r *http.Request) bool {
	return rt.stream != nil && (rt.serve == nil || acceptsEventStream(r.Header.Values("Accept")))
}

// pattern is the route's label in logs and metrics: method and canonical
// path.
func (rt *route) pattern() string { return rt.method + " " + rt.path }

// paths returns the canonical path and its alias: without the /v1 prefix
// for versioned routes, with it for the operational ones.
func (rt *route) paths() [2]string {
	if rest, ok := strings.CutPrefix(rt.path, "/v1/"); ok {
		return [2]string{rt.path, "/" + rest}
	}
	return [2]string{rt.path, "/v1" + rt.path}
}

// unversioned returns a request path without its /v1 prefix.
func unversioned(p string) string {
	if rest, ok := strings.CutPrefix(p, "/v1/"); ok {
		return "/" + rest
	}
	return p
}
