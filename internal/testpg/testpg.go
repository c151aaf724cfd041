// Package testpg gives tests a fresh PostgreSQL schema on the server named by
// SANDBOXWICH_TEST_POSTGRES_URL.
//
// Without that variable a test is skipped locally, and fails under CI=true:
// CI must never count a Postgres test as passed without running it.
package testpg

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"net/url"
	"os"
	"strings"
	"testing"

	_ "github.com/lib/pq" // the driver under test
)

// EnvURL names the variable that points tests at a PostgreSQL server.
const EnvURL = "SANDBOXWICH_TEST_POSTGRES_URL"

// BaseURL returns the server URL, skipping the test when it is unset (and
// failing it under CI=true).
func BaseURL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv(EnvURL)
	if u == "" {
		if os.Getenv("CI") == "true" {
			tb.Fatalf("%s is not set under CI=true: PostgreSQL tests must run", EnvURL)
		}
		tb.Skipf("%s is not set; skipping PostgreSQL test", EnvURL)
	}
	return u
}

// Schema creates a new, empty schema, drops it when the test ends, and
// returns a connection URL whose search_path is that schema.
func Schema(tb testing.TB) string {
	tb.Helper()
	base := BaseURL(tb)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "sbw_test_" + hex.EncodeToString(b[:])
	db, err := sql.Open("postgres", base)
	if err != nil {
		tb.Fatalf("postgres: %v", err)
	}
	defer db.Close()
	if _, err := db.Exec(`CREATE SCHEMA ` + name); err != nil {
		tb.Fatalf("postgres: create schema: %v", err)
	}
	tb.Cleanup(func() {
		db, err := sql.Open("postgres", base)
		if err != nil {
			return
		}
		defer db.Close()
		_, _ = db.Exec(`DROP SCHEMA ` + name + ` CASCADE`)
	})
	return withSearchPath(tb, base, name)
}

func withSearchPath(tb testing.TB, base, schema string) string {
	if strings.HasPrefix(base, "postgres://") || strings.HasPrefix(base, "postgresql://") {
		u, err := url.Parse(base)
		if err != nil {
			tb.Fatalf("%s: %v", EnvURL, err)
		}
		q := u.Query()
		q.Set("search_path", schema)
		u.RawQuery = q.Encode()
		return u.String()
	}
	return base + " search_path=" + schema
}
