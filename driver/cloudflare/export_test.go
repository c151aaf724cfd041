package cloudflare

// SetTestBackend makes p admit the runtime class for cells on backend
// (the bridge's loopback test backend in a local workerd) instead of a
// real Cloudflare Container. Tests only.
func SetTestBackend(p *Provider, backend string) { p.backend = backend }
