package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/driver/fake"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/pool"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
	"github.com/sandboxwich/sandboxwich/wire"
)

// Example_pools mounts the handler of a plane with a pool in an existing
// mux: GET /v1/pools reports the plane's pools with no further wiring.
func Example_pools() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "sandboxwich-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "sandboxwich.db"), sqlite.Options{})
	if err != nil {
		log.Fatal(err)
	}
	defer st.Close()
	keys, err := attest.NewKeyring([]byte("sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"))
	if err != nil {
		log.Fatal(err)
	}
	const set, class, digest = "release-set-2026-08-07", lease.KataMicroVM,
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	release := lease.Release{ReleaseSetID: set, RuntimeClass: class, PolicyDigest: digest,
		Signature: keys.SignRelease(lease.Release{ReleaseSetID: set, RuntimeClass: class, PolicyDigest: digest})}
	// The fake provider simulates cells (mode dry_run): it isolates nothing.
	plane, err := sandboxwich.New(st, keys, sandboxwich.WithLogger(slog.New(slog.DiscardHandler)),
		sandboxwich.WithPools(pool.Config{Name: "warm", TenantID: "acme", Release: release, Target: 2,
			Provider: fake.New(fake.Config{})}))
	if err != nil {
		log.Fatal(err)
	}
	api, err := httpapi.New(httpapi.Config{
		Plane: plane,
		Auth: httpapi.Auth{TenantTokens: map[string]string{"acme-secret-token": "acme"},
			OperatorToken: "operator-secret-token"},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/v1/", api)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	plane.Pools().Pass(ctx) // one reconcile pass; a server runs plane.Run

	req, _ := http.NewRequest("GET", srv.URL+"/v1/pools", nil)
	req.Header.Set("Authorization", "Bearer acme-secret-token")
	req.Header.Set(wire.OperatorHeader, "operator-secret-token")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	var pools wire.PoolsResponse
	if err := json.NewDecoder(res.Body).Decode(&pools); err != nil {
		log.Fatal(err)
	}
	for _, p := range pools.Pools {
		fmt.Println(res.StatusCode, p.Name, p.Mode, "ready:", p.Members["ready"])
	}
	// Output:
	// 200 warm dry_run ready: 2
}
