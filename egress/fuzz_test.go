package egress_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/errcode"
)

// FuzzParse checks the canonical form of CONTRACT §22 on arbitrary lists
// (the entries of list separated by commas): a refusal is invalid_request;
// whatever Parse accepts has a canonical form without uppercase or a
// trailing dot, sorted bytewise without duplicates, that parses back to
// itself (Parse(strings.Split(Canonical, "\n")) gives the same Canonical),
// whatever the order of the list; its digest is the SHA-256 of that form;
// it covers itself and the reparsed policy; and it allows each of its exact
// entries, on its port only.
func FuzzParse(f *testing.F) {
	f.Add("PKGS.test.,*.files.test:8443")
	f.Add("")
	f.Add("pkgs.test,pkgs.test:443,pkgs.test:80")
	f.Add("a.test:10,a.test:9,a.test:100")
	f.Add("*.a.b.test,xn--bcher-kva.test:65535")
	f.Add("127.0.0.1:443")
	f.Add("[::1]:443")
	f.Add("*.com")
	f.Add("a..test")
	f.Add("A.TEST.:0443")
	f.Fuzz(func(t *testing.T, list string) {
		var entries []string
		if list != "" {
			entries = strings.Split(list, ",")
		}
		p, err := egress.Parse(entries)
		if err != nil {
			if !errors.Is(err, errcode.ErrInvalidRequest) {
				t.Fatalf("Parse(%q) refused with %v, not invalid_request", entries, err)
			}
			return
		}
		c := p.Canonical()
		sum := sha256.Sum256([]byte(c))
		if p.Digest() != hex.EncodeToString(sum[:]) {
			t.Fatalf("Digest of %q", c)
		}
		if p.IsNone() {
			if len(entries) != 0 || c != "none" {
				t.Fatalf("Parse(%q) is none (%q)", entries, c)
			}
			return
		}
		if c != strings.ToLower(c) {
			t.Fatalf("canonical %q holds uppercase", c)
		}
		lines := strings.Split(c, "\n")
		if !slices.IsSorted(lines) || len(slices.Compact(slices.Clone(lines))) != len(lines) {
			t.Fatalf("canonical %q is not sorted without duplicates", c)
		}
		for i, line := range lines {
			host, _, ok := strings.Cut(line, ":")
			if !ok || strings.HasSuffix(host, ".") || strings.HasSuffix(line, ".") {
				t.Fatalf("canonical line %q has no port or a trailing dot", line)
			}
			if e := p.Entries()[i]; e.String() != line || e.Host != host {
				t.Fatalf("entry %d is %+v, line %q", i, e, line)
			}
		}
		again, err := egress.Parse(lines)
		if err != nil {
			t.Fatalf("the canonical form %q does not parse: %v", c, err)
		}
		if again.Canonical() != c {
			t.Fatalf("canonical %q parses to %q", c, again.Canonical())
		}
		slices.Reverse(entries)
		if r, err := egress.Parse(entries); err != nil || r.Canonical() != c {
			t.Fatalf("the reversed list gives %q, %v; want %q", r.Canonical(), err, c)
		}
		if !p.Covers(p) || !p.Covers(again) || !again.Covers(p) {
			t.Fatalf("%q does not cover itself", c)
		}
		for _, e := range p.Entries() {
			exact := !strings.HasPrefix(e.Host, "*")
			if p.Allows(e.Host, e.Port) != exact {
				t.Fatalf("Allows(%q, %d) = %v", e.Host, e.Port, !exact)
			}
			if exact && !p.Allows(strings.ToUpper(e.Host)+".", e.Port) {
				t.Fatalf("Allows(%q.) is false", strings.ToUpper(e.Host))
			}
			if p.Allows(e.Host, 0) {
				t.Fatalf("Allows(%q, 0)", e.Host)
			}
		}
	})
}
