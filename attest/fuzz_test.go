package attest_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// FuzzLoadKeyFile writes arbitrary bytes to a key file with an arbitrary
// group/other mode and checks attest.LoadKeyFile against CONTRACT §3.1, in
// the order the loader applies the rules:
//
//   - group or other access → ErrKeyFileMode;
//   - more than 4096 bytes in the file → ErrKeyTooLong;
//   - not UTF-8 → refused;
//   - fewer than 32 bytes after trimming white space → ErrKeyTooShort;
//   - otherwise accepted, and the keyring signs exactly like one made from
//     the trimmed bytes.
//
// No error message ever contains the key text.
func FuzzLoadKeyFile(f *testing.F) {
	const good = "sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"
	f.Add([]byte(good), uint8(0))
	f.Add([]byte("  \n"+good+"\r\n\t"), uint8(0))
	f.Add([]byte(good), uint8(0o44))
	f.Add([]byte(good), uint8(0o04))
	f.Add([]byte(good), uint8(0o40))
	f.Add([]byte(strings.Repeat("k", 31)), uint8(0))
	f.Add([]byte(strings.Repeat("k", 32)), uint8(0))
	f.Add([]byte(" "+strings.Repeat("k", 31)+"\n"), uint8(0))
	f.Add([]byte(strings.Repeat("k", 4096)), uint8(0))
	f.Add([]byte(strings.Repeat("k", 4097)), uint8(0))
	f.Add([]byte(strings.Repeat(" ", 4090)+strings.Repeat("k", 32)), uint8(0))
	f.Add([]byte(strings.Repeat("k", 40)+"\xff"), uint8(0))
	f.Add([]byte(strings.Repeat("k", 40)+"\x00"), uint8(0))
	f.Add([]byte{}, uint8(0))
	f.Add([]byte("\u00a0"+strings.Repeat("é", 16)+"\u2003"), uint8(0))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, data []byte, groupOther uint8) {
		perm := os.FileMode(0o600) | os.FileMode(groupOther)&0o077
		path := filepath.Join(dir, "signing.key")
		_ = os.Remove(path)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, perm); err != nil {
			t.Fatal(err)
		}
		keys, err := attest.LoadKeyFile(path)
		key := bytes.TrimSpace(data)
		switch {
		case perm&0o077 != 0:
			if !errors.Is(err, attest.ErrKeyFileMode) {
				t.Fatalf("mode %04o: err = %v, want ErrKeyFileMode", perm, err)
			}
		case len(data) > 4096:
			if !errors.Is(err, attest.ErrKeyTooLong) {
				t.Fatalf("%d-byte file: err = %v, want ErrKeyTooLong", len(data), err)
			}
		case !utf8.Valid(data):
			if err == nil {
				t.Fatal("a key file that is not UTF-8 was accepted")
			}
		case len(key) < 32:
			if !errors.Is(err, attest.ErrKeyTooShort) {
				t.Fatalf("%d-byte key: err = %v, want ErrKeyTooShort", len(key), err)
			}
		default:
			if err != nil {
				t.Fatalf("valid %d-byte key refused: %v", len(key), err)
			}
			want, err := attest.NewKeyring(key)
			if err != nil {
				t.Fatal(err)
			}
			d := strings.Repeat("a", 64)
			if keys.SignRelease(lease.Release{ReleaseSetID: "r", RuntimeClass: "kata_microvm", PolicyDigest: d}) != want.SignRelease(lease.Release{ReleaseSetID: "r", RuntimeClass: "kata_microvm", PolicyDigest: d}) {
				t.Fatal("the loaded key is not the trimmed file content")
			}
			if strings.Contains(keys.String(), string(key)) {
				t.Fatal("Keyring.String shows the key")
			}
		}
		if err != nil && len(key) >= 16 && !strings.Contains(path, string(key)) && strings.Contains(err.Error(), string(key)) {
			t.Fatalf("error message holds the key: %v", err)
		}
	})
}

var canonicalRule = regexp.MustCompile(`\A\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{3}|\.\d{6}|\.\d{9})?\+00:00\z`)

// FuzzCanonicalTime checks attest.CanonicalTime and attest.WireTime over
// every instant of years 0001–9999 and any zone: the form of CONTRACT §3.5
// (UTC, "+00:00" or "Z", a fraction of exactly 0, 3, 6 or 9 digits, the
// shortest that is exact), and a parse of the text returns the same instant.
func FuzzCanonicalTime(f *testing.F) {
	f.Add(int64(1786104000), uint32(123456789), int32(0))
	f.Add(int64(1786104000), uint32(100000000), int32(3600))
	f.Add(int64(1786104000), uint32(0), int32(-5*3600))
	f.Add(int64(1786104000), uint32(1000), int32(0))
	f.Add(int64(-62135596800), uint32(0), int32(0))         // 0001-01-01
	f.Add(int64(253402300799), uint32(999999999), int32(0)) // 9999-12-31T23:59:59.999999999
	f.Add(int64(0), uint32(1), int32(45*60))
	f.Fuzz(func(t *testing.T, sec int64, nsec uint32, offset int32) {
		const lo, hi = -62135596800, 253402300799 // years 0001 … 9999
		if sec < lo || sec > hi {
			sec = lo + (sec%(hi-lo)+(hi-lo))%(hi-lo)
		}
		zone := time.FixedZone("fuzz", int(offset%(18*3600)))
		tm := time.Unix(sec, int64(nsec%1_000_000_000)).In(zone)
		if tm.UTC().Year() > 9999 || tm.UTC().Year() < 1 {
			return
		}
		c := attest.CanonicalTime(tm)
		if !canonicalRule.MatchString(c) {
			t.Fatalf("CanonicalTime(%v) = %q: not the canonical form", tm, c)
		}
		if w := attest.WireTime(tm); w != strings.TrimSuffix(c, "+00:00")+"Z" {
			t.Fatalf("WireTime %q and CanonicalTime %q differ beyond the zone", w, c)
		}
		if c != attest.CanonicalTime(tm.UTC()) {
			t.Fatal("the canonical form depends on the zone of the time value")
		}
		back, err := time.Parse(time.RFC3339Nano, c)
		if err != nil || !back.Equal(tm) {
			t.Fatalf("parse(%q) = %v, %v; want %v", c, back, err, tm)
		}
		frac := ""
		if i := strings.IndexByte(c, '.'); i >= 0 {
			frac = c[i+1 : len(c)-len("+00:00")]
		}
		ns := tm.Nanosecond()
		want := 9
		switch {
		case ns == 0:
			want = 0
		case ns%1_000_000 == 0:
			want = 3
		case ns%1000 == 0:
			want = 6
		}
		if len(frac) != want {
			t.Fatalf("%q: %d fraction digits for %d ns, want %d", c, len(frac), ns, want)
		}
	})
}

// FuzzReleaseSignature checks that a release signature is 49 characters,
// swrs1_ and unpadded base64url, that it verifies, and that no other string
// verifies for the same release (VerifyRelease compares the whole string).
func FuzzReleaseSignature(f *testing.F) {
	f.Add("release-set-2026-08-07", "kata_microvm", strings.Repeat("a", 64), "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0")
	f.Add("release-set-2026-08-07", "gvisor_lower_risk", strings.Repeat("a", 64), "swrs1_l_MSn7I9tFC5tmki9cls8QDtVeI-LlYmNg8IyfrmC0c")
	f.Add("r", "kata_microvm", strings.Repeat("b", 64), "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0=")
	f.Add("r", "kata_microvm", strings.Repeat("b", 64), "SWRS1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0")
	keys, err := attest.NewKeyring([]byte("sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"))
	if err != nil {
		f.Fatal(err)
	}
	shape := regexp.MustCompile(`\Aswrs1_[A-Za-z0-9_-]{43}\z`)
	f.Fuzz(func(t *testing.T, id, class, digest, presented string) {
		sig := keys.SignRelease(lease.Release{ReleaseSetID: id, RuntimeClass: lease.RuntimeClass(class), PolicyDigest: digest})
		if !shape.MatchString(sig) {
			t.Fatalf("signature %q has the wrong shape", sig)
		}
		if !keys.VerifyRelease(lease.Release{ReleaseSetID: id, RuntimeClass: lease.RuntimeClass(class), PolicyDigest: digest, Signature: sig}) {
			t.Fatal("a signature does not verify")
		}
		if keys.VerifyRelease(lease.Release{ReleaseSetID: id, RuntimeClass: lease.RuntimeClass(class), PolicyDigest: digest, Signature: presented}) != (presented == sig) {
			t.Fatalf("VerifyRelease(%q) disagrees with string equality against %q", presented, sig)
		}
	})
}
