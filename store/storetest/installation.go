package storetest

import (
	"testing"

	"github.com/sandboxwich/sandboxwich/store"
)

// checkInstallation asks two fresh stores for their installation: each
// answers the same value twice, a non-empty one, and the two differ.
func checkInstallation(t *testing.T, newStore func(t *testing.T) store.Store) {
	var ids [2]string
	for i := range ids {
		e := newEnv(t, newStore(t))
		ids[i] = installationOf(t, e.s)
		if again := installationOf(t, e.s); again != ids[i] {
			t.Errorf("Installation changed from %q to %q", ids[i], again)
		}
	}
	if ids[0] == ids[1] {
		t.Errorf("two databases share the installation %q", ids[0])
	}
}

// installationOf returns s's installation, failing the test when it is
// empty. Its form is the store's own (drivers hash it: driver.InstallationTag).
func installationOf(t *testing.T, s store.Store) string {
	t.Helper()
	id, err := s.Installation(t.Context())
	if err != nil {
		t.Fatalf("Installation: %v", err)
	}
	if id == "" {
		t.Fatal("Installation is empty")
	}
	return id
}
