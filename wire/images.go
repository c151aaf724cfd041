package wire

// The bodies of the image routes (CONTRACT §21 "Prefetch"): images pulled
// into a pool's image cache ahead of the claims, and listed.

// Image states (ImageState.State).
const (
	ImageQueued  = "queued"
	ImagePulling = "pulling"
	ImageCached  = "cached"
	ImageFailed  = "failed"
)

// PrefetchRequest is the body of POST /v1/images/prefetch: a pool of the
// caller's tenant and 1 to 1000 image references, each pinned by digest
// and allowed by the pool.
type PrefetchRequest struct {
	Pool   string   `json:"pool"`
	Images []string `json:"images"`
}

// ImageState is one image of a prefetch answer or an image listing.
type ImageState struct {
	// Image is the reference in canonical form, host/repo@sha256:<hex>
	// (a tag beside the digest dropped).
	Image string `json:"image"`
	// State is ImageQueued, ImagePulling, ImageCached or ImageFailed.
	State string `json:"state"`
	// Code and Message say why a failed image failed
	// (insufficient_storage: the image cache's budget has no room;
	// image_pull_failed); null otherwise.
	Code    *string `json:"code"`
	Message *string `json:"message"`
	// Bytes is what a cached image takes in the cache; null otherwise.
	Bytes *int64 `json:"bytes"`
}

// ImagesResponse answers POST /v1/images/prefetch (202: one state per
// distinct image, in the order first named) and GET /v1/images (200: the
// pool's images, sorted).
type ImagesResponse struct {
	OK     bool         `json:"ok"`
	Pool   string       `json:"pool"`
	Images []ImageState `json:"images"`
}
