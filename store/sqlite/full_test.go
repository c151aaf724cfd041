package sqlite_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
	"github.com/sandboxwich/sandboxwich/store/sqlite"
)

// TestDiskFullIsStoreUnavailable: on a file system with no space left, a
// write fails with store_unavailable (503, retried by clients) instead of
// an internal error, and nothing of it is read back; once space returns,
// the same write commits. The database lives on a tmpfs of 2 MiB that a
// filler file fills (mounting one needs root).
func TestDiskFullIsStoreUnavailable(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") == "true" {
			t.Fatal("CI=true: this test mounts a tmpfs and needs root")
		}
		t.Skip("needs root to mount a tmpfs")
	}
	dir := t.TempDir()
	if err := syscall.Mount("sbw-full-test", dir, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "size=2m,mode=0700"); err != nil {
		t.Fatalf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	s := open(t, filepath.Join(dir, "sandboxwich.db"), sqlite.Options{})
	defer s.Close()

	filler := filepath.Join(dir, "filler")
	fill(t, filler)
	p := store.PrepareParams{CellID: uuid.Must(uuid.NewV7()), TenantID: "acme", WorkerID: uuid.NewString(),
		ProviderCellID: strings.Repeat("p", 512),
		Release: lease.Release{ReleaseSetID: "rel", RuntimeClass: lease.KataMicroVM, PolicyDigest: strings.Repeat("ab", 32),
			Signature: strings.Repeat("s", 64)},
		ExpiresAt: time.Now().Add(time.Hour)}
	// Every page the WAL can still take goes to the writes before the
	// first one that finds no room.
	var err error
	for range 200 {
		p.CellID, p.ProviderCellID = uuid.Must(uuid.NewV7()), uuid.NewString()+strings.Repeat("p", 512)
		if _, err = s.Prepare(t.Context(), p); err != nil {
			break
		}
	}
	if !errors.Is(err, errcode.ErrStoreUnavailable) {
		t.Fatalf("a write on a full disk: %v, want store_unavailable", err)
	}
	if _, _, werr := s.WorkerCell(t.Context(), p.WorkerID, p.CellID); !errors.Is(werr, errcode.ErrNotFound) {
		t.Fatalf("the failed write is read back: %v", werr)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Prepare(t.Context(), p); err != nil {
		t.Fatalf("the same write once space returned: %v", err)
	}
	if _, _, err := s.WorkerCell(t.Context(), p.WorkerID, p.CellID); err != nil {
		t.Fatalf("the committed write: %v", err)
	}
}

// fill writes path until the file system has no space left.
func fill(t *testing.T, path string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return
			}
			t.Fatal(err)
		}
	}
}
