package httpapi

import (
	"context"
	_ "embed"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

//go:embed openapi.json
var openAPIDoc []byte

// OpenAPI returns the committed OpenAPI 3 document of the handler's routes
// (the embedded openapi.json), exactly as served at /v1/openapi.json and
// /openapi.json. The caller must not modify the returned slice.
func OpenAPI() []byte { return openAPIDoc }

// openAPI serves the OpenAPI document verbatim.
func (h *handler) openAPI(w http.ResponseWriter, _ *http.Request) {
	h.write(w, reply{status: http.StatusOK, body: openAPIDoc})
}

// listPools serves GET /v1/pools (operator): the plane's pools of the
// operator's own tenant only (CONTRACT §19).
func (h *handler) listPools(c *call) (int, any, error) {
	sts, err := h.plane.PoolStatus(c.ctx())
	if err != nil {
		return 0, nil, errcode.Wrap(errcode.Internal, "list pools", err)
	}
	pools := []wire.Pool{}
	for _, s := range sts {
		if s.TenantID == c.p.tenant {
			pools = append(pools, wirePool(s))
		}
	}
	return http.StatusOK, wire.PoolsResponse{OK: true, Pools: pools}, nil
}

// wirePool is a pool's status in wire form, with every member state key.
func wirePool(s sandboxwich.PoolStatus) wire.Pool {
	members := make(map[string]int, len(lease.MemberStates))
	for _, st := range lease.MemberStates {
		members[string(st)] = s.Members[st]
	}
	p := wire.Pool{
		Name: s.Name, Provider: s.Provider, Mode: string(s.ProviderMode),
		TenantID: s.TenantID, Release: s.Release, Target: s.Target,
		ReadyFloor: s.ReadyFloor, MaxProvisioning: s.MaxProvisioning,
		ReadyTTLSeconds: int(s.ReadyTTL / time.Second), Members: members,
	}
	if !s.LastReconcile.IsZero() {
		p.LastReconcileAt = &wire.Time{Time: s.LastReconcile}
	}
	if s.LastError != "" {
		p.LastError = &s.LastError
	}
	if len(s.ImageClass) > 0 {
		p.Images, p.MaxCells, p.MaxCold, p.WarmPerImage = s.ImageClass, s.Target, s.MaxProvisioning, s.WarmPerImage
		p.ImageCells = []wire.ImageCells{}
		for _, im := range s.Images {
			p.ImageCells = append(p.ImageCells, wire.ImageCells{Image: im.Image, Ready: im.Ready, Provisioning: im.Provisioning, Waiting: im.Waiting})
		}
	}
	return p
}

// health is the body of /healthz and /readyz. CheckedAt is the time of the
// check, as the Rust implementation (and its SDK's health() and ready())
// has it.
type health struct {
	OK        bool             `json:"ok"`
	Service   string           `json:"service"`
	CheckedAt wire.Time        `json:"checked_at"`
	Database  *healthComponent `json:"database,omitempty"`
	Auth      *healthComponent `json:"auth,omitempty"`
}

// healthComponent is one readiness check.
type healthComponent struct {
	OK      bool    `json:"ok"`
	Message *string `json:"message"`
}

const serviceName = "sandboxwich"

// healthz serves GET /healthz: the process is up.
func (h *handler) healthz(w http.ResponseWriter, _ *http.Request) {
	h.writeHealth(w, health{OK: true, Service: serviceName, CheckedAt: wire.Time{Time: h.plane.Now()}})
}

// readyz serves GET /readyz: the store is reachable and migrated, and
// authentication is configured. 503 otherwise.
func (h *handler) readyz(w http.ResponseWriter, r *http.Request) {
	db, auth := &healthComponent{OK: true}, &healthComponent{OK: true}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := h.plane.Ping(ctx); err != nil {
		h.log.LogAttrs(r.Context(), slog.LevelWarn, "httpapi: readiness: store",
			slog.String("request_id", requestIDOf(r.Context())), slog.String("error", err.Error()))
		db = &healthComponent{Message: ptr("database unreachable or not migrated")}
	}
	if !h.auth.configured() {
		auth = &healthComponent{Message: ptr("no authentication is configured")}
	}
	h.writeHealth(w, health{OK: db.OK && auth.OK, Service: serviceName, CheckedAt: wire.Time{Time: h.plane.Now()}, Database: db, Auth: auth})
}

func (h *handler) writeHealth(w http.ResponseWriter, body health) {
	status := http.StatusOK
	if !body.OK {
		status = http.StatusServiceUnavailable
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Cache-Control", "no-store")
	h.write(w, reply{status: status, body: b})
}

func ptr[T any](v T) *T { return &v }
