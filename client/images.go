package client

import (
	"context"
	"net/http"
	"net/url"

	"github.com/sandboxwich/sandboxwich/wire"
)

// Prefetch asks the server to pull images into the image cache of the
// tenant's pool ahead of the claims (POST /v1/images/prefetch, CONTRACT
// §21) and returns each image's state at once: one per distinct image, in
// canonical form (host/repo@sha256:<hex>), in the order first named —
// cached, queued, or the state of a prefetch already in flight. The pulls
// run in the background; read their progress with [Client.Images].
//
// images lists 1 to 1000 references pinned by digest, each allowed by the
// pool (errcode.ErrImageNotAllowed otherwise, errcode.ErrInvalidRequest for
// a bad list or a pool whose provider keeps no image cache); an unknown or
// foreign pool is errcode.ErrNotFound; a pool with 1000 images queued or
// being pulled is errcode.ErrTooManyRequests. A refused call starts
// nothing. It retries like a read: an image in flight is never pulled
// twice.
func (c *Client) Prefetch(ctx context.Context, pool string, images []string) ([]wire.ImageState, error) {
	var resp wire.ImagesResponse
	err := c.do(ctx, request{method: http.MethodPost, path: "/images/prefetch", retry: true,
		body: wire.PrefetchRequest{Pool: pool, Images: images}}, &resp)
	return resp.Images, err
}

// Images lists the images of the tenant's pool (GET /v1/images?pool=):
// the cached images of its image cache that it allows, and the queued,
// pulling and failed images of the server's recent prefetches for it,
// sorted by image. An unknown or foreign pool is errcode.ErrNotFound.
func (c *Client) Images(ctx context.Context, pool string) ([]wire.ImageState, error) {
	var resp wire.ImagesResponse
	err := c.do(ctx, request{method: http.MethodGet, path: "/images?" + url.Values{"pool": {pool}}.Encode(), retry: true}, &resp)
	return resp.Images, err
}
