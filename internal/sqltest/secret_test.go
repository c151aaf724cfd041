package sqltest

import (
	"database/sql"
	"path/filepath"
	"slices"
	"testing"

	_ "modernc.org/sqlite"
)

// TestFindSecret is the positive control of CheckNoSecret: it must find a
// secret in any column type and in any table.
func TestFindSecret(t *testing.T) {
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "secret.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, q := range []string{
		`CREATE TABLE a (id INTEGER PRIMARY KEY, note TEXT, blob BLOB, n INTEGER)`,
		`CREATE TABLE "odd ""name""" (x TEXT)`,
		`CREATE TABLE empty (x TEXT)`,
		`INSERT INTO a (note, blob, n) VALUES ('nothing', NULL, 1), ('prefix swla1_SECRET suffix', NULL, 2), (NULL, x'73776c61315f534543524554', 3)`,
		`INSERT INTO "odd ""name""" (x) VALUES ('swla1_SECRET')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	hits, tables, err := findSecret(t.Context(), db, "swla1_SECRET")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"a.note", "a.blob", `odd "name".x`}
	slices.Sort(hits)
	slices.Sort(want)
	if !slices.Equal(hits, want) || tables != 3 {
		t.Errorf("findSecret = %q in %d tables, want %q in 3", hits, tables, want)
	}
	hits, _, err = findSecret(t.Context(), db, "absent")
	if err != nil || len(hits) != 0 {
		t.Errorf("findSecret(absent) = %q, %v", hits, err)
	}
}
