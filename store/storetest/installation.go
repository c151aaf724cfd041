package storetest

import (
	"regexp"
	"testing"

	"github.com/sandboxwich/sandboxwich/store"
)

// installationRE is the form of the shipped stores' installation identity.
var installationRE = regexp.MustCompile(`^[0-9a-f]{32}$`)

// checkInstallation asks two fresh stores for their installation: each
// answers the same value twice, a non-empty one, and the two differ.
func checkInstallation(t *testing.T, newStore func(t *testing.T) store.Store) {
	var ids [2]string
	for i := range ids {
		e := newEnv(t, newStore)
		ids[i] = installationOf(t, e.s)
		if again := installationOf(t, e.s); again != ids[i] {
			t.Errorf("Installation changed from %q to %q", ids[i], again)
		}
	}
	if ids[0] == ids[1] {
		t.Errorf("two databases share the installation %q", ids[0])
	}
}

// installationOf returns s's installation, failing the test unless it has
// the form the shipped stores create.
func installationOf(t *testing.T, s store.Store) string {
	t.Helper()
	id, err := s.Installation(t.Context())
	if err != nil {
		t.Fatalf("Installation: %v", err)
	}
	if !installationRE.MatchString(id) {
		t.Fatalf("Installation = %q, want 32 lowercase hex digits", id)
	}
	return id
}
