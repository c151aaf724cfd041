// Package cloudflare is the Cloudflare driver (CONTRACT §18): each cell is
// a Cloudflare Container — one Durable Object and one container instance —
// behind the project's own bridge Worker (./bridge), and runs this
// project's cell agent in an image the operator builds (./Dockerfile) and
// pins by digest.
//
// # Runtime traffic
//
// The driver never calls the Cloudflare API at run time. It speaks only to
// the bridge, over HTTPS with a bearer token read from a file (for every
// request: a rotated token is picked up; it never reaches a log, argv, an
// environment or an error). Provision creates the cell's Durable Object
// (idempotent by cell ID) and waits until its agent answers; Inspect reads
// the object's status; Destroy has the bridge destroy the container and
// read its absence back, and returns nil only on that proof (or when the
// cell ID names another identity), else an error wrapping
// driver.ErrUncertain; List reads the bridge's registry of the pool's
// cells. Agent returns an agent.Conn over the bridge: the Durable Object
// is the control side of §13, holding the cell's one-shot state (waiting →
// active bound to one fence → ended) durably, validating every request and
// forwarding only the sanitized activation and the agent protocol's own
// fields to the container. A container that stops or restarts ends the
// cell: driver.ErrCellLost.
//
// 401 from the bridge (or 401/403 from the Cloudflare API) is
// ErrUnauthorized, a configuration error never retried; 429 and 5xx are
// retried with exponential backoff for idempotent requests (create,
// status, delete, list, and every read-back request). An agent operation
// is never retried by the driver: the plane retries it as an exact replay.
//
// # Read-back
//
// With a ReadBack configured, the driver reads the deployment back through
// cloudflare-go v6 (packages workers and durable_objects only) at start-up
// (VerifyDeployment) and whenever the last read-back is older than
// ReadBack.Interval: the newest deployment must send all traffic to one
// version; that version must list the configured container class, the
// cells' Durable Object binding to that class, the variables CELL_IMAGE,
// CELL_INSTANCE_TYPE and CONTAINER_CLASS with the configured values, no
// test-only binding, and the configured compatibility date and flags; the
// script's settings must agree; the binding's namespace must be that
// class of that script, stored in SQLite; and the container application
// (GET /accounts/{a}/containers/applications/{id}) must run the configured
// image digest and instance type for that namespace. Inspect reports
// Config.RuntimeClass — the operator's explicit statement of which signed
// class a Cloudflare Container counts as; there is no default — only while
// that read-back holds and the bridge's status of the cell agrees (a real
// Cloudflare Container, the same class, image and instance type). Anything
// else reports no class, which the plane refuses as
// runtime_class_boundary_unverified.
//
// What this does not prove: Cloudflare documents that each container
// instance runs in its own virtual machine, but no API reports it per
// instance; the per-cell image and instance type are what the bridge
// recorded from its deployed configuration when the cell started. See
// README.md for what was and was not verified against a real account.
//
// # Settings
//
// ConfigFromSettings reads the SANDBOXWICH_CLOUDFLARE_* settings of a pool;
// Settings lists the keys.
package cloudflare
