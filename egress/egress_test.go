package egress_test

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/errcode"
)

// The vector of CONTRACT §22.
var vectorList = []string{"PKGS.test.", "*.files.test:8443"}

const (
	vectorCanonical = "*.files.test:8443\npkgs.test:443\npkgs.test:80"
	vectorDigest    = "a519198c3dddcd86202ceffae15243aa45fc6968f788e231cba60d1ca134e330"
)

func mustParse(t testing.TB, entries ...string) egress.Policy {
	t.Helper()
	p, err := egress.Parse(entries)
	if err != nil {
		t.Fatalf("Parse(%q): %v", entries, err)
	}
	return p
}

func TestVector(t *testing.T) {
	p := mustParse(t, vectorList...)
	if got := p.Canonical(); got != vectorCanonical {
		t.Errorf("Canonical = %q, want %q", got, vectorCanonical)
	}
	if got := p.Digest(); got != vectorDigest {
		t.Errorf("Digest = %s, want %s", got, vectorDigest)
	}
	want := []egress.Entry{{Host: "*.files.test", Port: 8443}, {Host: "pkgs.test", Port: 443}, {Host: "pkgs.test", Port: 80}}
	if got := p.Entries(); !slices.Equal(got, want) {
		t.Errorf("Entries = %v, want %v", got, want)
	}
	if p.IsNone() {
		t.Error("IsNone of the vector")
	}
	if got := p.FenceString(); got != vectorCanonical {
		t.Errorf("FenceString = %q, want the canonical form", got)
	}
}

func TestNone(t *testing.T) {
	for name, p := range map[string]egress.Policy{
		"zero": {}, "None": egress.None, "nil list": mustParse(t), "empty list": mustParse(t, []string{}...),
	} {
		if !p.IsNone() || p.Canonical() != "none" || len(p.Entries()) != 0 {
			t.Errorf("%s: IsNone %v, Canonical %q, Entries %v", name, p.IsNone(), p.Canonical(), p.Entries())
		}
		sum := sha256.Sum256([]byte("none"))
		if p.Digest() != hex.EncodeToString(sum[:]) {
			t.Errorf("%s: Digest %s", name, p.Digest())
		}
		if p.FenceString() != "" {
			t.Errorf("%s: FenceString %q, want the empty string", name, p.FenceString())
		}
		if p.Allows("pkgs.test", 443) {
			t.Errorf("%s allows pkgs.test:443", name)
		}
		if !p.Covers(egress.None) || p.Covers(mustParse(t, "pkgs.test")) {
			t.Errorf("%s: Covers", name)
		}
	}
}

func TestEntriesIsACopy(t *testing.T) {
	p := mustParse(t, vectorList...)
	p.Entries()[0] = egress.Entry{Host: "evil.test", Port: 1}
	if p.Canonical() != vectorCanonical {
		t.Fatal("changing Entries' answer changed the policy")
	}
}

// name returns a valid name of exactly n bytes (n ≥ 3) of labels of at
// most 63 bytes.
func name(n int) string {
	var labels []string
	for n > 0 {
		l := min(n, 63)
		if n-l == 1 || n-l == 0 && len(labels) == 0 {
			l -= 2 // leave room for ".x" and keep two labels
		}
		labels = append(labels, strings.Repeat("a", l))
		n -= l + 1
	}
	return strings.Join(labels, ".")
}

func TestName(t *testing.T) {
	for _, n := range []int{3, 4, 63, 64, 65, 66, 127, 253, 254} {
		if got := len(name(n)); got != n {
			t.Errorf("len(name(%d)) = %d", n, got)
		}
	}
}

func TestParseAccepts(t *testing.T) {
	label63 := strings.Repeat("b", 63)
	for _, tc := range []struct {
		entries []string
		want    string
	}{
		{[]string{"pkgs.test"}, "pkgs.test:443\npkgs.test:80"},
		{[]string{"Pkgs.TEST:8080"}, "pkgs.test:8080"},
		{[]string{"pkgs.test.:443"}, "pkgs.test:443"},
		{[]string{"pkgs.test", "pkgs.test:443", "PKGS.test.:80"}, "pkgs.test:443\npkgs.test:80"},
		{[]string{"b.test:1", "a.test:65535"}, "a.test:65535\nb.test:1"},
		// Bytewise order of the host:port strings, not by host then port.
		{[]string{"a.test:10", "a.test:9", "a.test:100"}, "a.test:10\na.test:100\na.test:9"},
		{[]string{"a.testb:1", "a.test:1"}, "a.test:1\na.testb:1"},
		{[]string{"z.test:1", "*.z.test:1"}, "*.z.test:1\nz.test:1"},
		{[]string{"*.Files.Test.:8443"}, "*.files.test:8443"},
		{[]string{"*.a.b.files.test"}, "*.a.b.files.test:443\n*.a.b.files.test:80"},
		{[]string{"xn--bcher-kva.test:443"}, "xn--bcher-kva.test:443"},
		{[]string{"1password.com:443", "a-b.c-d.test:443"}, "1password.com:443\na-b.c-d.test:443"},
		{[]string{"a.b2:443", "a.0xg:443"}, "a.0xg:443\na.b2:443"},
		{[]string{label63 + ".test:443"}, label63 + ".test:443"},
		{[]string{name(253) + ":443"}, name(253) + ":443"},
		{[]string{name(253) + ".:443"}, name(253) + ":443"},
		{[]string{"*." + name(251) + ":443"}, "*." + name(251) + ":443"},
	} {
		p, err := egress.Parse(tc.entries)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.entries, err)
			continue
		}
		if got := p.Canonical(); got != tc.want {
			t.Errorf("Parse(%q).Canonical() = %q, want %q", tc.entries, got, tc.want)
		}
	}
	many := make([]string, egress.MaxEntries)
	for i := range many {
		many[i] = fmt.Sprintf("h%d.test", i)
	}
	if p, err := egress.Parse(many); err != nil || len(p.Entries()) != 2*egress.MaxEntries {
		t.Errorf("%d entries: %v, %d canonical entries", egress.MaxEntries, err, len(p.Entries()))
	}
}

func TestParseRefuses(t *testing.T) {
	label64 := strings.Repeat("b", 64)
	for _, tc := range []struct {
		entry, why string
	}{
		{"", "empty"},
		{" pkgs.test", "whitespace"},
		{"pkgs.test ", "whitespace"},
		{"pkgs .test", "whitespace"},
		{"pkgs.test\n", "whitespace"},
		{"pkgs.test\t:443", "whitespace"},
		{"pkgs.test:443\r", "whitespace"},
		{"pkgs.test\x00", "control"},
		{"pkgs.test\x7f", "control"},
		{"pkgs.te\u00a0st", "ASCII"},
		{"bücher.test", "ASCII"},
		{"pkgs..test", "label is empty"},
		{".pkgs.test", "label is empty"},
		{"pkgs.test..", "label is empty"},
		{".", "host is empty"},
		{":443", "host is empty"},
		{"-a.test", "hyphen"},
		{"a-.test", "hyphen"},
		{"a.test-", "hyphen"},
		{"a_b.test", "letter, digit or hyphen"},
		{"a.test/path", "letter, digit or hyphen"},
		{"user@a.test", "letter, digit or hyphen"},
		{"http://a.test", "port"},
		{"a.test:443:80", "more than one"},
		{label64 + ".test", "longer than 63"},
		{name(254), "longer than 253"},
		{name(254) + ".", "longer than 253"},
		{"*." + name(252), "longer than 253"},
		{"pkgs.test:", "port"},
		{"pkgs.test:0", "port"},
		{"pkgs.test:00", "port"},
		{"pkgs.test:0443", "port"},
		{"pkgs.test:65536", "port"},
		{"pkgs.test:99999", "port"},
		{"pkgs.test:100000", "port"},
		{"pkgs.test:18446744073709551616", "port"},
		{"pkgs.test:+443", "port"},
		{"pkgs.test:-1", "port"},
		{"pkgs.test:0x1bb", "port"},
		{"pkgs.test:44a", "port"},
		{"pkgs.test:4e2", "port"},
		{"pkgs.test:٤٤٣", "port"},
		{"127.0.0.1", "IP literal"},
		{"127.0.0.1:443", "IP literal"},
		{"169.254.169.254:80", "IP literal"},
		{"1.2.3.4.", "IP literal"},
		{"::1", "IP literal"},
		{"[::1]", "IP literal"},
		{"[::1]:443", "IP literal"},
		{"2001:db8::1", "IP literal"},
		{"fe80::1%eth0", "IP literal"},
		{"::ffff:127.0.0.1", "IP literal"},
		{"[pkgs.test]:443", "not a DNS name"},
		{"127.1", "IP literal"},
		{"0x7f.1", "IP literal"},
		{"a.0x7f", "IP literal"},
		{"a.0x", "IP literal"},
		{"example.123", "IP literal"},
		{"*.1.2", "IP literal"},
		{"localhost", "one label"},
		{"pkgs:443", "one label"},
		{"none", "one label"},
		{"*", "wildcard"},
		{"*.", "wildcard"},
		{"*:443", "wildcard"},
		{"*.com", "two labels"},
		{"*.test.", "two labels"},
		{"**.files.test", "wildcard"},
		{"*files.test", "wildcard"},
		{"a*.files.test", "wildcard"},
		{"a.*.files.test", "wildcard"},
		{"files.*", "wildcard"},
		{"*.*.files.test", "wildcard"},
		{"*..files.test", "label is empty"},
		{"*.-a.test", "hyphen"},
	} {
		_, err := egress.Parse([]string{"ok.test", tc.entry})
		if err == nil {
			t.Errorf("Parse accepted %q (%s)", tc.entry, tc.why)
			continue
		}
		if !errors.Is(err, errcode.ErrInvalidRequest) || errcode.CodeOf(err) != errcode.InvalidRequest {
			t.Errorf("%q: %v is not invalid_request", tc.entry, err)
		}
		msg := err.Error()
		quoted := strconv.Quote(tc.entry)
		if len(tc.entry) > 100 {
			quoted = strconv.Quote(tc.entry[:100]) + "…"
		}
		if !strings.Contains(msg, "egress[1] "+quoted+": ") {
			t.Errorf("%q: message %q does not name the entry", tc.entry, msg)
		}
		if !strings.Contains(msg, tc.why) {
			t.Errorf("%q: message %q does not say %q", tc.entry, msg, tc.why)
		}
	}
	// More than MaxEntries, even of one repeated entry.
	many := make([]string, egress.MaxEntries+1)
	for i := range many {
		many[i] = "pkgs.test"
	}
	_, err := egress.Parse(many)
	if !errors.Is(err, errcode.ErrInvalidRequest) || !strings.Contains(err.Error(), "257 entries") {
		t.Errorf("%d entries: %v", len(many), err)
	}
}

func TestCovers(t *testing.T) {
	pool := mustParse(t, "*.files.test:8443", "pkgs.test", "*.b.test:443", "exact.test:22")
	for _, tc := range []struct {
		claim []string
		want  bool
	}{
		{nil, true},
		{[]string{"pkgs.test"}, true},
		{[]string{"PKGS.test.:80"}, true},
		{[]string{"pkgs.test:8080"}, false},
		{[]string{"a.files.test:8443"}, true},
		{[]string{"a.b.files.test:8443"}, true},
		{[]string{"*.files.test:8443"}, true},
		{[]string{"*.a.files.test:8443"}, true},
		{[]string{"files.test:8443"}, false}, // *.suffix does not match suffix itself
		{[]string{"a.files.test"}, false},    // :443 and :80, the wildcard is :8443
		{[]string{"a.files.test:443"}, false},
		{[]string{"xfiles.test:8443"}, false},
		{[]string{"a.xfiles.test:8443"}, false},
		{[]string{"a.files.test.evil.test:8443"}, false},
		{[]string{"x.b.test:443", "pkgs.test:443"}, true},
		{[]string{"x.b.test"}, false}, // :80 is not in the pool
		{[]string{"*.xb.test:443"}, false},
		{[]string{"*.b.test:443"}, true},
		{[]string{"b.test:443"}, false},
		{[]string{"exact.test:22"}, true},
		{[]string{"*.exact.test:22"}, false}, // an exact name never covers a wildcard
		{[]string{"sub.exact.test:22"}, false},
		{[]string{"pkgs.test", "a.files.test:8443", "other.test:443"}, false},
	} {
		if got := pool.Covers(mustParse(t, tc.claim...)); got != tc.want {
			t.Errorf("Covers(%q) = %v, want %v", tc.claim, got, tc.want)
		}
	}
	if !pool.Covers(pool) {
		t.Error("a policy does not cover itself")
	}
	if narrow := mustParse(t, "pkgs.test:443"); narrow.Covers(pool) {
		t.Error("a narrow policy covers a wider one")
	}
	// A wildcard claim is covered by a wider wildcard, never the reverse.
	wide, narrow := mustParse(t, "*.files.test:1"), mustParse(t, "*.a.files.test:1")
	if !wide.Covers(narrow) || narrow.Covers(wide) {
		t.Error("wildcard inclusion")
	}
}

func TestAllows(t *testing.T) {
	p := mustParse(t, vectorList...)
	for _, tc := range []struct {
		host string
		port uint16
		want bool
	}{
		{"pkgs.test", 443, true},
		{"pkgs.test", 80, true},
		{"PKGS.Test.", 443, true},
		{"pkgs.test", 8443, false},
		{"pkgs.test", 0, false},
		{"a.pkgs.test", 443, false},
		{"a.files.test", 8443, true},
		{"A.B.Files.Test.", 8443, true},
		{"files.test", 8443, false},
		{"a.files.test", 443, false},
		{"xfiles.test", 8443, false},
		{"*.files.test", 8443, false}, // a wildcard is not a name a cell reaches
		{"a.files.test.evil.test", 8443, false},
		{"", 443, false},
		{".", 443, false},
		{"pkgs.test..", 443, false},
		{"pkgs.test:443", 443, false},
		{"pkgs.test ", 443, false},
		{"127.0.0.1", 443, false},
		{"::1", 443, false},
		{"a..files.test", 8443, false},
		{"a_b.files.test", 8443, false},
		{"0x7f.1", 8443, false},
	} {
		if got := p.Allows(tc.host, tc.port); got != tc.want {
			t.Errorf("Allows(%q, %d) = %v, want %v", tc.host, tc.port, got, tc.want)
		}
		// A name allowed on a port is allowed as a name; AllowsName
		// refuses what Allows refuses on every port.
		if tc.want && !p.AllowsName(tc.host) {
			t.Errorf("AllowsName(%q) = false, yet Allows on %d", tc.host, tc.port)
		}
	}
	for host, want := range map[string]bool{"pkgs.test": true, "A.B.Files.Test.": true, "files.test": false,
		"a.pkgs.test": false, "*.files.test": false, "127.0.0.1": false, "": false, "evil.test": false} {
		if got := p.AllowsName(host); got != want {
			t.Errorf("AllowsName(%q) = %v, want %v", host, got, want)
		}
	}
	if egress.None.AllowsName("pkgs.test") {
		t.Error("None allows a name")
	}
}

func TestParseIgnoresOrder(t *testing.T) {
	a := mustParse(t, "c.test:1", "a.test", "*.b.test:9", "a.test:443")
	b := mustParse(t, "*.B.test:9", "A.test.:80", "c.test:1", "a.test:443", "c.test:1")
	if a.Canonical() != b.Canonical() || a.Digest() != b.Digest() {
		t.Errorf("%q != %q", a.Canonical(), b.Canonical())
	}
}

func BenchmarkAllows(b *testing.B) {
	entries := make([]string, egress.MaxEntries)
	for i := range entries {
		entries[i] = fmt.Sprintf("*.h%d.test", i)
	}
	p := mustParse(b, entries...)
	b.ReportAllocs()
	for b.Loop() {
		p.Allows("x.h255.test", 80)
	}
}
