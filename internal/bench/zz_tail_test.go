package bench

import (
	"context"
	"os"
	"testing"
)

func TestZZTail(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{os.Getenv("TAILDB")} {
		var b *backend
		var err error
		if name == "sqlite" {
			b, err = openSQLite(ctx, t.TempDir()+"/tail.db")
		} else {
			b, err = openPostgres(ctx, os.Getenv("SANDBOXWICH_TEST_POSTGRES_URL"))
		}
		if err != nil {
			t.Fatal(err)
		}
		r, err := benchTail(ctx, b, 64, 1200)
		b.cleanup()
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d empty; claim n %d p50 %.2f ms p99 %.2f ms (×%.2f) %.0f/s; requests p50 %.2f p99 %.2f errors %d", name, r.Empty, r.Claims.N, r.Claims.P50MS, r.Claims.P99MS, r.Ratio, r.Claims.Throughput, r.Requests.P50MS, r.Requests.P99MS, r.Requests.Errors)
	}
}
