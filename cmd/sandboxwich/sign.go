package main

import (
	"context"
	"fmt"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// signRelease prints swrs1_… for a release, reading the key from its file.
func signRelease(_ context.Context, e env, args []string) error {
	fs := newFlags(e, "sign-release")
	keyFile := fs.String("key-file", e.getenv("SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE"), "signing key file (env SANDBOXWICH_STERILE_CELL_SIGNING_KEY_FILE)")
	id := fs.String("release-set-id", "", "release set ID")
	class := fs.String("runtime-class", "", "kata_microvm or gvisor_lower_risk")
	digest := fs.String("policy-digest", "", "64 lowercase hex digits")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *keyFile == "":
		return fmt.Errorf("%w: --key-file is required", errUsage)
	case !lease.ValidIdentifier(*id):
		return fmt.Errorf("%w: --release-set-id is not an identifier", errUsage)
	case !lease.RuntimeClass(*class).Valid():
		return fmt.Errorf("%w: --runtime-class must be kata_microvm or gvisor_lower_risk", errUsage)
	case !lease.ValidPolicyDigest(*digest):
		return fmt.Errorf("%w: --policy-digest must be 64 lowercase hex digits", errUsage)
	}
	keys, err := attest.LoadKeyFile(*keyFile)
	if err != nil {
		return err
	}
	fmt.Fprintln(e.stdout, keys.SignRelease(lease.Release{ReleaseSetID: *id, RuntimeClass: lease.RuntimeClass(*class), PolicyDigest: *digest}))
	return nil
}
