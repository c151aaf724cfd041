package sqltest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
)

// CheckNoSecret fails t if secret occurs in any value of any table of db,
// each value read as text. It finds the tables through sqlite_master or,
// failing that, through information_schema for the current schema, so it
// works on the SQLite and PostgreSQL stores; it fails t when it finds no
// table, so that a check against the wrong database never passes silently.
//
// Run it after the store under test has handled the secret, for example
// after a claim signed with a real lease attestation: the token must never
// be persisted, only its digest.
func CheckNoSecret(t *testing.T, db *sql.DB, secret string) {
	t.Helper()
	if secret == "" {
		t.Fatal("CheckNoSecret: empty secret")
	}
	hits, tables, err := findSecret(t.Context(), db, secret)
	if err != nil {
		t.Fatalf("CheckNoSecret: %v", err)
	}
	if tables == 0 {
		t.Fatal("CheckNoSecret: the database has no tables")
	}
	for _, h := range hits {
		t.Errorf("a secret is stored in %s", h)
	}
}

// checkNoSecretStored claims through a store with a real attestation and
// scans the database for the token, its MAC part and the signing key. It
// first checks that the database holds the token's digest, so a scan of
// the wrong database cannot pass.
func checkNoSecretStored(t *testing.T, d database) {
	s := d.store(t)
	inv := NewInventory(t)
	inv.Prepare(t, s, time.Hour)
	p := inv.Claim(uuid.Must(uuid.NewV7()), inv.Release)
	var token string
	p.Sign = func(l lease.Lease) string {
		token = inv.Keys.LeaseToken(attest.ClaimsOf(l))
		return attest.Digest(token)
	}
	res, err := s.Claim(t.Context(), p)
	if err != nil || res.Lease == nil || !strings.HasPrefix(token, "swla1_") || res.Lease.AttestationDigest != attest.Digest(token) {
		t.Fatalf("Claim = %+v, %v; want a lease whose digest is that of the token %q", res, err, token)
	}
	var digests []string
	if err := sqlx.SelectContext(t.Context(), sqlx.NewDb(d.db, ""), &digests,
		`SELECT attestation_digest FROM cells WHERE attestation_digest IS NOT NULL`); err != nil {
		t.Fatal(err)
	}
	if len(digests) != 1 || digests[0] != res.Lease.AttestationDigest {
		t.Fatalf("the scanned database holds the digests %q, want only %s", digests, res.Lease.AttestationDigest)
	}
	for _, secret := range []string{token, strings.TrimPrefix(token, "swla1_"), testenv.Key} {
		CheckNoSecret(t, d.db, secret)
	}
	// The event log holds none of it, nor the digests of the lease and
	// its release (CONTRACT §16), though it recorded the claim.
	var n int
	if err := d.db.QueryRowContext(t.Context(), `SELECT count(*) FROM events WHERE type = 'cell.leased'`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the event log holds %d cell.leased events (%v), want 1", n, err)
	}
	for _, secret := range []string{token, res.Lease.AttestationDigest, inv.Release.PolicyDigest, inv.Release.Signature} {
		hits, err := scanTable(t.Context(), d.db, "events", secret)
		if err != nil {
			t.Fatal(err)
		}
		if len(hits) > 0 {
			t.Errorf("the event log holds a secret or digest in %v", hits)
		}
	}
}

// findSecret returns the table.column of every value that contains secret,
// and the number of tables scanned.
func findSecret(ctx context.Context, db *sql.DB, secret string) (hits []string, tables int, err error) {
	names, err := tableNames(ctx, sqlx.NewDb(db, ""))
	if err != nil {
		return nil, 0, err
	}
	for _, name := range names {
		h, err := scanTable(ctx, db, name, secret)
		if err != nil {
			return nil, 0, fmt.Errorf("table %s: %w", name, err)
		}
		hits = append(hits, h...)
	}
	return hits, len(names), nil
}

func tableNames(ctx context.Context, db *sqlx.DB) ([]string, error) {
	var names []string
	err := sqlx.SelectContext(ctx, db, &names, `SELECT name FROM sqlite_master WHERE type = 'table'`)
	if err == nil {
		return names, nil
	}
	err2 := sqlx.SelectContext(ctx, db, &names, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`)
	if err2 != nil {
		return nil, fmt.Errorf("list tables: %w", errors.Join(err, err2))
	}
	return names, nil
}

func scanTable(ctx context.Context, db *sql.DB, table, secret string) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT * FROM "`+strings.ReplaceAll(table, `"`, `""`)+`"`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return nil, err
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	var hits []string
	for rows.Next() {
		if err := rows.Scan(ptrs...); err != nil {
			return nil, err
		}
		for i, v := range vals {
			var text string
			switch v := v.(type) {
			case nil:
			case []byte:
				text = string(v)
			case string:
				text = v
			default:
				text = fmt.Sprint(v)
			}
			if strings.Contains(text, secret) {
				hits = append(hits, table+"."+cols[i])
			}
		}
	}
	return hits, rows.Err()
}
