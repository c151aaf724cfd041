package storetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"testing"
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

// findSecret returns the table.column of every value that contains secret,
// and the number of tables scanned.
func findSecret(ctx context.Context, db *sql.DB, secret string) (hits []string, tables int, err error) {
	names, err := tableNames(ctx, db)
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

func tableNames(ctx context.Context, db *sql.DB) ([]string, error) {
	names, err := queryStrings(ctx, db, `SELECT name FROM sqlite_master WHERE type = 'table'`)
	if err == nil {
		return names, nil
	}
	names, err2 := queryStrings(ctx, db, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`)
	if err2 != nil {
		return nil, fmt.Errorf("list tables: %w", errors.Join(err, err2))
	}
	return names, nil
}

func queryStrings(ctx context.Context, db *sql.DB, q string) ([]string, error) {
	rows, err := db.QueryContext(ctx, q)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, rows.Err()
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
