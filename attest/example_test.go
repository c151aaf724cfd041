package attest_test

import (
	"fmt"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
)

func ExampleKeyring_SignRelease() {
	// The test key of CONTRACT.md 3.6. Real keys come from LoadKeyFile.
	k, err := attest.NewKeyring([]byte("sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"))
	if err != nil {
		panic(err)
	}
	rel := lease.Release{ReleaseSetID: "release-set-2026-08-07", RuntimeClass: lease.KataMicroVM, PolicyDigest: strings.Repeat("a", 64)}
	rel.Signature = k.SignRelease(rel)
	fmt.Println(rel.Signature)
	fmt.Println(k.VerifyRelease(rel))
	rel.RuntimeClass = lease.GVisorLowerRisk
	fmt.Println(k.VerifyRelease(rel))
	// Output:
	// swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0
	// true
	// false
}

func ExampleKeyring_LeaseToken() {
	k, err := attest.NewKeyring([]byte("sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"))
	if err != nil {
		panic(err)
	}
	token := k.LeaseToken(attest.LeaseClaims{
		LeaseID:          "01890a5d-ac96-774b-bcce-b302099a8057",
		CellID:           "01890a5d-ac96-774b-bcce-b302099a8058",
		Generation:       2,
		ReleaseSetID:     "release-set-2026-08-07",
		RuntimeClass:     "kata_microvm",
		PolicyDigest:     strings.Repeat("a", 64),
		OrganizationID:   "org-1",
		WorkspaceID:      "workspace-1",
		ThreadID:         "thread-1",
		RunnerSessionID:  "session-1",
		ExpiresAt:        time.Date(2026, 8, 7, 12, 0, 0, 123456789, time.UTC),
		ReleaseSignature: "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0",
	})
	// The token goes to the claimer only; the store keeps its digest.
	fmt.Println(token)
	fmt.Println(attest.Digest(token))
	// Output:
	// swla1_F0qwlTXnAMyLdjGH0WMymO7DtQAhiAqPu5fMH7SXwSk
	// 2576eac96c47749ff3c33cd14c8f87904be7ca7d8d413d5c4a6de245d7df11b9
}

func ExampleCanonicalTime() {
	t := time.Date(2026, 8, 7, 14, 0, 0, 100_000_000, time.FixedZone("CEST", 2*3600))
	fmt.Println(attest.CanonicalTime(t))
	fmt.Println(attest.WireTime(t))
	// Output:
	// 2026-08-07T12:00:00.100+00:00
	// 2026-08-07T12:00:00.100Z
}
