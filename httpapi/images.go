package httpapi

import (
	"net/http"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/wire"
)

// The image routes of CONTRACT §21 "Prefetch": POST /v1/images/prefetch
// and GET /v1/images?pool=. A prefetch is idempotent by nature (an image
// in flight is not pulled twice), so Idempotency-Key is ignored: a stored
// answer would replay states long outdated.

// prefetch serves POST /v1/images/prefetch: 202 with each image's state.
func (h *handler) prefetch(c *call) (int, any, error) {
	req, err := decodeBody(c.body, readPrefetch)
	if err != nil {
		return 0, nil, err
	}
	sts, err := h.plane.Prefetch(c.ctx(), c.p.tenant, req.Pool, req.Images)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusAccepted, imagesResponse(req.Pool, sts), nil
}

// readPrefetch reads a prefetch's body; the plane checks its values.
func readPrefetch(o *object) wire.PrefetchRequest {
	return wire.PrefetchRequest{Pool: o.str("pool"), Images: o.strs("images")}
}

// listImages serves GET /v1/images?pool=: the pool's images.
func (h *handler) listImages(c *call) (int, any, error) {
	get, err := queryParams(c.r.URL.RawQuery)
	if err != nil {
		return 0, nil, err
	}
	name, ok, err := get("pool")
	if err != nil {
		return 0, nil, err
	}
	if !ok {
		return 0, nil, invalid("pool is required")
	}
	sts, err := h.plane.Images(c.ctx(), c.p.tenant, name)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, imagesResponse(name, sts), nil
}

// imagesResponse is the wire form of a pool's image states.
func imagesResponse(poolName string, sts []sandboxwich.ImageState) wire.ImagesResponse {
	resp := wire.ImagesResponse{OK: true, Pool: poolName, Images: make([]wire.ImageState, 0, len(sts))}
	for _, st := range sts {
		w := wire.ImageState{Image: st.Image, State: string(st.State), Code: nonEmpty(st.Code), Message: nonEmpty(st.Message)}
		if st.State == sandboxwich.ImageCached {
			w.Bytes = &st.Bytes
		}
		resp.Images = append(resp.Images, w)
	}
	return resp
}
