package bench

import (
	"context"
	"testing"
)

// The tail figure leases the cells it is asked for under the whole mix,
// with no request failing.
func TestTail(t *testing.T) {
	ctx := context.Background()
	b, err := openSQLite(ctx, t.TempDir()+"/tail.db")
	if err != nil {
		t.Fatal(err)
	}
	defer b.cleanup()
	const claims = 50
	r, err := benchTail(ctx, b, 8, claims)
	if err != nil {
		t.Fatal(err)
	}
	if r.Claims.N < claims || r.Claims.Errors != 0 || r.Requests.Errors != 0 {
		t.Fatalf("claims %+v (%d empty), requests %+v: want %d claims and no error", r.Claims, r.Empty, r.Requests, claims)
	}
	if r.Requests.N < 4*r.Claims.N { // validate, status and release follow each claim
		t.Fatalf("%d requests for %d claims: the mix did not run", r.Requests.N, claims)
	}
	if !(r.Ratio >= 1) {
		t.Fatalf("p99/p50 = %v", r.Ratio)
	}
	t.Logf("%d empty claims; claim p50 %.2f ms p99 %.2f ms (×%.2f); requests p50 %.2f ms", r.Empty, r.Claims.P50MS, r.Claims.P99MS, r.Ratio, r.Requests.P50MS)
}
