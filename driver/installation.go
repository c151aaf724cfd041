package driver

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
)

// InstallationTagLen is the length of an installation tag.
const InstallationTagLen = 12

var installationTagRE = regexp.MustCompile(`^[0-9a-f]{12}$`)

// InstallationTag returns the tag of an installation identity (what
// store.Store.Installation returns): the first 12 lowercase hex digits of
// its SHA-256. Drivers put the tag on every provider object they create —
// in a container ID, in a label — and list only objects carrying their
// own, so that planes sharing a provider (one host, one runsc state root,
// one namespace) never take each other's objects for orphans. It is short
// because runsc's control socket path, which holds the container ID, may
// not exceed 107 bytes.
func InstallationTag(installation string) string {
	sum := sha256.Sum256([]byte(installation))
	return hex.EncodeToString(sum[:])[:InstallationTagLen]
}

// CheckInstallationTag returns an error unless tag has the form
// InstallationTag returns. Drivers refuse a configuration without one.
func CheckInstallationTag(tag string) error {
	if !installationTagRE.MatchString(tag) {
		return fmt.Errorf("installation tag %q: want %d lowercase hex digits (driver.InstallationTag of the store's installation)", tag, InstallationTagLen)
	}
	return nil
}
