package httpapi

import (
	"context"
	"encoding/json"
	"net/http"
)

// call is one request to a JSON route, after authentication.
type call struct {
	r    *http.Request
	w    http.ResponseWriter
	p    principal
	body []byte // the raw JSON body of body routes
}

func (c *call) ctx() context.Context { return c.r.Context() }

// serveRoute returns the handler of one route: authentication and
// authorization (401/404), content type (415), body size (413),
// Idempotency-Key (refused where the route streams its answer), then the
// route itself.
func (h *handler) serveRoute(rt *route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		setRoute(r.Context(), rt.pattern())
		if rt.access != accessProbe && !h.auth.configured() {
			h.writeError(w, r, errAuthNotConfigured)
			return
		}
		p, err := h.authorize(r, rt)
		if err != nil {
			h.writeError(w, r, err)
			return
		}
		if rt.raw != nil {
			rt.raw(h, w, r)
			return
		}
		c := &call{r: r, w: w, p: p}
		if rt.body || (rt.optBody && r.ContentLength != 0) {
			if c.body, err = readBody(w, r, rt.bodyLimit()); err != nil {
				h.writeError(w, r, err)
				return
			}
		}
		if rt.streams(r) {
			// A response the route writes itself is never stored, so it
			// could never be replayed: a key there is refused, not ignored.
			if _, ok, err := idempotencyKey(r); err != nil || ok {
				h.writeError(w, r, errIdemRefused)
				return
			}
			rt.stream(h, c, w)
			return
		}
		h.write(w, h.run(rt, c))
	})
}

// run answers a JSON route, through the idempotency layer when the route
// and principal take part in it.
func (h *handler) run(rt *route, c *call) reply {
	if rt.idem != idemNone && c.p.kind == kindTenant {
		key, ok, err := idempotencyKey(c.r)
		if err != nil {
			return h.errorReply(c.r, err)
		}
		if ok && rt.keyCheck != nil {
			if err := rt.keyCheck(c); err != nil {
				return h.errorReply(c.r, err)
			}
		}
		if ok {
			return h.idempotent(rt, c, key)
		}
	}
	return h.invoke(rt, c)
}

// invoke calls the route and encodes its answer.
func (h *handler) invoke(rt *route, c *call) reply {
	status, v, err := rt.serve(h, c)
	if err != nil {
		return h.errorReply(c.r, err)
	}
	rep, err := jsonReply(status, v)
	if sa, ok := v.(storedAnswer); ok && err == nil {
		if sv := sa.storedForm(); sv != nil {
			rep.stored, err = json.Marshal(sv)
		}
	}
	if err != nil {
		return h.errorReply(c.r, err)
	}
	return rep
}
