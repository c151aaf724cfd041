package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// Example mounts the /v1 handler in an existing mux, over a SQLite store.
func Example() {
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
	// In production, load the key from a file: attest.LoadKeyFile(path).
	keys, err := attest.NewKeyring([]byte("sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"))
	if err != nil {
		log.Fatal(err)
	}
	plane, err := sandboxwich.New(st, keys)
	if err != nil {
		log.Fatal(err)
	}
	api, err := httpapi.New(httpapi.Config{
		Plane:  plane,
		Auth:   httpapi.Auth{TenantTokens: map[string]string{"acme-secret-token": "acme"}},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		log.Fatal(err)
	}

	// The existing application's mux: the handler serves /v1/... and the
	// probes; everything else stays the application's.
	mux := http.NewServeMux()
	mux.Handle("/v1/", api)
	mux.Handle("/healthz", api)
	mux.Handle("/readyz", api)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "the application") })

	srv := httptest.NewServer(mux)
	defer srv.Close()

	req, _ := http.NewRequest("POST", srv.URL+"/v1/sterile-cells/claim", strings.NewReader(`{
		"release": {
			"release_set_id": "release-set-2026-08-07",
			"runtime_class": "kata_microvm",
			"policy_digest": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
			"signature": "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0"
		},
		"organization_id": "org-1", "workspace_id": "workspace-1",
		"thread_id": "thread-1", "runner_session_id": "session-1"
	}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer acme-secret-token")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Println(res.StatusCode, string(body))

	res, err = http.Get(srv.URL + "/")
	if err != nil {
		log.Fatal(err)
	}
	body, _ = io.ReadAll(res.Body)
	res.Body.Close()
	fmt.Println(res.StatusCode, string(body))
	// Output:
	// 200 {"ok":true,"lease":null,"lease_attestation":null}
	// 200 the application
}
