package lease_test

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sandboxwich/sandboxwich/lease"
)

// The identifier and policy-digest rules of CONTRACT §2, written a second
// time as regular expressions: the fuzz targets check that the hand-written
// byte loops agree with them on every input.
var (
	identifierRule = regexp.MustCompile(`\A[A-Za-z0-9\-_.:/]{1,256}\z`)
	digestRule     = regexp.MustCompile(`\A[0-9a-f]{64}\z`)
)

// FuzzIdentifier checks lease.ValidIdentifier against the rule: accepted
// exactly when 1–256 bytes of [A-Za-z0-9-_.:/]. An accepted identifier is
// therefore plain ASCII: no NUL byte (it could not split a NUL-joined MAC
// message), no white space, no unicode look-alike, no percent escape and no
// backslash.
func FuzzIdentifier(f *testing.F) {
	for _, s := range []string{
		"org-1", "a", "A.b_c:d/e-9", strings.Repeat("x", 256), strings.Repeat("x", 257), "",
		"org\x00", "оrg", "ｏrg", "org 1", "org\n", "../../etc/passwd", "..\\x", "%2e%2e", "é", "\xff",
		"release-set-2026-08-07", "urn:uuid:01890a5d-ac96-774b-bcce-b302099a8057",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := lease.ValidIdentifier(s)
		if want := identifierRule.MatchString(s); got != want {
			t.Fatalf("ValidIdentifier(%q) = %v, rule says %v", s, got, want)
		}
		if !got {
			return
		}
		if len(s) == 0 || len(s) > lease.MaxIdentifierLen {
			t.Fatalf("accepted identifier of %d bytes", len(s))
		}
		if strings.ContainsAny(s, "\x00 \t\r\n\\%\"'") || !utf8.ValidString(s) {
			t.Fatalf("accepted identifier %q holds a forbidden byte", s)
		}
		for _, r := range s {
			if r >= utf8.RuneSelf {
				t.Fatalf("accepted identifier %q is not ASCII", s)
			}
		}
	})
}

// FuzzPolicyDigest checks lease.ValidPolicyDigest against the rule: exactly
// 64 lowercase hex digits, so uppercase and every other spelling of the same
// digest is refused (one digest, one spelling, one signature).
func FuzzPolicyDigest(f *testing.F) {
	for _, s := range []string{
		strings.Repeat("a", 64), strings.Repeat("A", 64), strings.Repeat("a", 63), strings.Repeat("a", 65),
		strings.Repeat("g", 64), strings.Repeat("0", 64), "", strings.Repeat("a", 63) + "\x00",
		"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := lease.ValidPolicyDigest(s)
		if want := digestRule.MatchString(s); got != want {
			t.Fatalf("ValidPolicyDigest(%q) = %v, rule says %v", s, got, want)
		}
		if got && strings.ToLower(s) != s {
			t.Fatalf("accepted a digest with uppercase: %q", s)
		}
		if up := strings.ToUpper(s); got && up != s && lease.ValidPolicyDigest(up) {
			t.Fatalf("both %q and %q accepted", s, up)
		}
	})
}
