//go:build unix

package sqlite_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// TestFilesPrivate: under the common umask 022, Open creates the database
// and its -wal and -shm files readable by their owner only (0600). Not
// parallel: it sets the process's umask.
func TestFilesPrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	path := filepath.Join(t.TempDir(), "private.db")
	s := open(t, path, sqlite.Options{})
	defer s.Close()
	if err := s.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Errorf("stat %s: %v", filepath.Base(p), err)
			continue
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s has mode %#o, want 0600", filepath.Base(p), m)
		}
	}
}
