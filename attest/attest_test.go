package attest_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Test vectors of CONTRACT.md 3.6.
const (
	testKey       = "sandboxwich-test-sterile-cell-signing-key-32-bytes-minimum"
	testReleaseID = "release-set-2026-08-07"
	kataSignature = "swrs1_e9tjahDQxqFMnsShzD-gJ815SbqsCNKrHlBA96hCM_0"
	gvisorSig     = "swrs1_l_MSn7I9tFC5tmki9cls8QDtVeI-LlYmNg8IyfrmC0c"
	testToken     = "swla1_F0qwlTXnAMyLdjGH0WMymO7DtQAhiAqPu5fMH7SXwSk"
	testDigest    = "2576eac96c47749ff3c33cd14c8f87904be7ca7d8d413d5c4a6de245d7df11b9"
)

var testPolicy = strings.Repeat("a", 64)

func testKeyring(t testing.TB) *attest.Keyring {
	t.Helper()
	k, err := attest.NewKeyring([]byte(testKey))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func testClaims() attest.LeaseClaims {
	return attest.LeaseClaims{
		LeaseID:          "01890a5d-ac96-774b-bcce-b302099a8057",
		CellID:           "01890a5d-ac96-774b-bcce-b302099a8058",
		Generation:       2,
		ReleaseSetID:     testReleaseID,
		RuntimeClass:     "kata_microvm",
		PolicyDigest:     testPolicy,
		OrganizationID:   "org-1",
		WorkspaceID:      "workspace-1",
		ThreadID:         "thread-1",
		RunnerSessionID:  "session-1",
		ExpiresAt:        time.Date(2026, 8, 7, 12, 0, 0, 123456789, time.UTC),
		ReleaseSignature: kataSignature,
	}
}

func TestSignReleaseVectors(t *testing.T) {
	k := testKeyring(t)
	for _, tc := range []struct {
		class, want string
	}{
		{"kata_microvm", kataSignature},
		{"gvisor_lower_risk", gvisorSig},
	} {
		if got := k.SignRelease(lease.Release{ReleaseSetID: testReleaseID, RuntimeClass: lease.RuntimeClass(tc.class), PolicyDigest: testPolicy}); got != tc.want {
			t.Errorf("SignRelease(%q) = %q, want %q", tc.class, got, tc.want)
		}
		if got := len(tc.want); got != 49 {
			t.Errorf("len(%q) = %d, want 49", tc.want, got)
		}
	}
}

func TestLeaseTokenVector(t *testing.T) {
	k := testKeyring(t)
	got := k.LeaseToken(testClaims())
	if got != testToken {
		t.Errorf("LeaseToken = %q, want %q", got, testToken)
	}
	if d := attest.Digest(got); d != testDigest {
		t.Errorf("Digest(LeaseToken) = %q, want %q", d, testDigest)
	}
	if !attest.EqualDigest(attest.Digest(got), testDigest) {
		t.Error("EqualDigest(Digest(token), vector) = false")
	}

	// The same instant in another zone is the same token.
	c := testClaims()
	c.ExpiresAt = c.ExpiresAt.In(time.FixedZone("UTC-7", -7*3600))
	if got := k.LeaseToken(c); got != testToken {
		t.Errorf("LeaseToken with non-UTC expiry = %q, want %q", got, testToken)
	}
}

func TestLeaseTokenCoversEveryField(t *testing.T) {
	k := testKeyring(t)
	for name, mutate := range map[string]func(*attest.LeaseClaims){
		"LeaseID":          func(c *attest.LeaseClaims) { c.LeaseID = "01890a5d-ac96-774b-bcce-b302099a8059" },
		"CellID":           func(c *attest.LeaseClaims) { c.CellID = "01890a5d-ac96-774b-bcce-b302099a8059" },
		"Generation":       func(c *attest.LeaseClaims) { c.Generation = 1 },
		"ReleaseSetID":     func(c *attest.LeaseClaims) { c.ReleaseSetID = "release-set-2026-08-08" },
		"RuntimeClass":     func(c *attest.LeaseClaims) { c.RuntimeClass = "gvisor_lower_risk" },
		"PolicyDigest":     func(c *attest.LeaseClaims) { c.PolicyDigest = strings.Repeat("b", 64) },
		"OrganizationID":   func(c *attest.LeaseClaims) { c.OrganizationID = "org-2" },
		"WorkspaceID":      func(c *attest.LeaseClaims) { c.WorkspaceID = "workspace-2" },
		"ThreadID":         func(c *attest.LeaseClaims) { c.ThreadID = "thread-2" },
		"RunnerSessionID":  func(c *attest.LeaseClaims) { c.RunnerSessionID = "session-2" },
		"ExpiresAt":        func(c *attest.LeaseClaims) { c.ExpiresAt = c.ExpiresAt.Add(time.Nanosecond) },
		"ReleaseSignature": func(c *attest.LeaseClaims) { c.ReleaseSignature = gvisorSig },
	} {
		c := testClaims()
		mutate(&c)
		if got := k.LeaseToken(c); got == testToken {
			t.Errorf("changing %s does not change the token", name)
		}
	}
}

func TestVerifyRelease(t *testing.T) {
	k := testKeyring(t)
	flipped := []byte(kataSignature)
	flipped[20] ^= 1
	for _, tc := range []struct {
		name, class, policy, sig string
		want                     bool
	}{
		{"kata", "kata_microvm", testPolicy, kataSignature, true},
		{"gvisor", "gvisor_lower_risk", testPolicy, gvisorSig, true},
		{"flipped char", "kata_microvm", testPolicy, string(flipped), false},
		{"flipped last char", "kata_microvm", testPolicy, kataSignature[:48] + "1", false},
		{"truncated", "kata_microvm", testPolicy, kataSignature[:48], false},
		{"extended", "kata_microvm", testPolicy, kataSignature + "A", false},
		{"no prefix", "kata_microvm", testPolicy, kataSignature[6:], false},
		{"empty", "kata_microvm", testPolicy, "", false},
		{"other class", "gvisor_lower_risk", testPolicy, kataSignature, false},
		{"other policy", "kata_microvm", strings.Repeat("b", 64), kataSignature, false},
		{"uppercase policy", "kata_microvm", strings.Repeat("A", 64), kataSignature, false},
	} {
		if got := k.VerifyRelease(lease.Release{ReleaseSetID: testReleaseID, RuntimeClass: lease.RuntimeClass(tc.class), PolicyDigest: tc.policy, Signature: tc.sig}); got != tc.want {
			t.Errorf("%s: VerifyRelease = %v, want %v", tc.name, got, tc.want)
		}
	}

	other, err := attest.NewKeyring([]byte(strings.Repeat("k", 32)))
	if err != nil {
		t.Fatal(err)
	}
	if other.VerifyRelease(lease.Release{ReleaseSetID: testReleaseID, RuntimeClass: "kata_microvm", PolicyDigest: testPolicy, Signature: kataSignature}) {
		t.Error("VerifyRelease under another key = true")
	}
}

func TestEqualDigest(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{testDigest, testDigest, true},
		{"", "", true},
		{testDigest, strings.ToUpper(testDigest), false},
		{testDigest, testDigest[:63], false},
		{testDigest, "", false},
	} {
		if got := attest.EqualDigest(tc.a, tc.b); got != tc.want {
			t.Errorf("EqualDigest(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}

func TestTimeFormats(t *testing.T) {
	base := time.Date(2026, 8, 7, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   time.Time
		want string // canonical form without the zone suffix
	}{
		{base, "2026-08-07T12:00:00"},
		{base.Add(100 * time.Millisecond), "2026-08-07T12:00:00.100"},
		{base.Add(123 * time.Millisecond), "2026-08-07T12:00:00.123"},
		{base.Add(123456 * time.Microsecond), "2026-08-07T12:00:00.123456"},
		{base.Add(123456789), "2026-08-07T12:00:00.123456789"},
		{base.Add(time.Microsecond), "2026-08-07T12:00:00.000001"},
		{base.Add(time.Nanosecond), "2026-08-07T12:00:00.000000001"},
		{base.Add(123456700), "2026-08-07T12:00:00.123456700"},
		{base.Add(999999999), "2026-08-07T12:00:00.999999999"},
		{base.Add(120 * time.Microsecond), "2026-08-07T12:00:00.000120"},
		// A non-UTC zone is converted to UTC.
		{time.Date(2026, 8, 7, 14, 0, 0, 5e8, time.FixedZone("CEST", 2*3600)), "2026-08-07T12:00:00.500"},
		{time.Date(2026, 8, 6, 23, 30, 0, 0, time.FixedZone("", -(12*3600+30*60))), "2026-08-07T12:00:00"},
		{time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), "0001-01-01T00:00:00"},
	} {
		if got, want := attest.CanonicalTime(tc.in), tc.want+"+00:00"; got != want {
			t.Errorf("CanonicalTime(%v) = %q, want %q", tc.in, got, want)
		}
		if got, want := attest.WireTime(tc.in), tc.want+"Z"; got != want {
			t.Errorf("WireTime(%v) = %q, want %q", tc.in, got, want)
		}
		// Both forms parse back to the same instant.
		for _, s := range []string{attest.CanonicalTime(tc.in), attest.WireTime(tc.in)} {
			back, err := time.Parse(time.RFC3339Nano, s)
			if err != nil || !back.Equal(tc.in) {
				t.Errorf("time.Parse(%q) = %v, %v; want %v", s, back, err, tc.in)
			}
		}
	}
	// A monotonic clock reading does not show.
	now := time.Now()
	if got, want := attest.CanonicalTime(now), attest.CanonicalTime(now.Round(0)); got != want {
		t.Errorf("CanonicalTime(time.Now()) = %q, want %q", got, want)
	}
}

func TestNewKeyring(t *testing.T) {
	for _, tc := range []struct {
		size int
		want error
	}{
		{0, attest.ErrKeyTooShort},
		{31, attest.ErrKeyTooShort},
		{32, nil},
		{4096, nil},
		{4097, attest.ErrKeyTooLong},
	} {
		k, err := attest.NewKeyring([]byte(strings.Repeat("s", tc.size)))
		if !errors.Is(err, tc.want) || (err == nil) != (k != nil) {
			t.Errorf("NewKeyring(%d bytes) = %v, %v; want error %v", tc.size, k, err, tc.want)
		}
	}

	// The keyring keeps its own copy of the key.
	key := []byte(testKey)
	k, err := attest.NewKeyring(key)
	if err != nil {
		t.Fatal(err)
	}
	clear(key)
	if got := k.SignRelease(lease.Release{ReleaseSetID: testReleaseID, RuntimeClass: "kata_microvm", PolicyDigest: testPolicy}); got != kataSignature {
		t.Errorf("after the caller cleared its key: SignRelease = %q, want %q", got, kataSignature)
	}
}

func TestKeyringDoesNotPrintKey(t *testing.T) {
	k := testKeyring(t)
	for _, s := range []string{k.String(), k.GoString()} {
		if strings.Contains(s, testKey) || strings.Contains(s, "sandboxwich-test") {
			t.Errorf("formatted Keyring %q shows the key", s)
		}
	}
}

func TestZeroKeyringPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("SignRelease on a zero Keyring did not panic")
		}
	}()
	var k attest.Keyring
	k.SignRelease(lease.Release{ReleaseSetID: testReleaseID, RuntimeClass: "kata_microvm", PolicyDigest: testPolicy})
}

// writeKey writes content to a new file in a test directory and sets its mode
// exactly (the umask does not apply to chmod).
func writeKey(t *testing.T, content string, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "signing-key")
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoadKeyFile(t *testing.T) {
	key32 := "0123456789abcdef0123456789abcdef"
	key31 := "short-key-aaaaaaaaaaaaaaaaaaaaa" // secret text that must not leak
	if len(key32) != 32 || len(key31) != 31 {
		t.Fatal("bad test keys")
	}
	for _, tc := range []struct {
		name    string
		content string
		mode    os.FileMode
		wantKey string // the key that must have been loaded
		wantErr error  // nil for no particular sentinel
		errText string // substring of the error message
	}{
		{name: "vector key with newline", content: testKey + "\n", mode: 0o600, wantKey: testKey},
		{name: "surrounding white space", content: " \t\r\n" + testKey + " \r\n\n", mode: 0o600, wantKey: testKey},
		{name: "unicode white space", content: "\u00a0" + testKey + "\u2003\n", mode: 0o600, wantKey: testKey},
		{name: "inner space kept", content: "  " + key32 + " " + key32 + "\n", mode: 0o600, wantKey: key32 + " " + key32},
		{name: "exactly 32 bytes", content: key32, mode: 0o600, wantKey: key32},
		{name: "read-only owner", content: key32, mode: 0o400, wantKey: key32},
		{name: "owner executable", content: key32, mode: 0o700, wantKey: key32},
		{name: "4096-byte file", content: strings.Repeat("x", 4096), mode: 0o600, wantKey: strings.Repeat("x", 4096)},
		{name: "31 bytes", content: key31, mode: 0o600, wantErr: attest.ErrKeyTooShort, errText: "31 bytes"},
		{name: "31 bytes after trimming", content: "\n " + key31 + " \n", mode: 0o600, wantErr: attest.ErrKeyTooShort, errText: "31 bytes"},
		{name: "only white space", content: strings.Repeat(" \n", 40), mode: 0o600, wantErr: attest.ErrKeyTooShort},
		{name: "empty", content: "", mode: 0o600, wantErr: attest.ErrKeyTooShort, errText: "0 bytes"},
		{name: "4097-byte file", content: strings.Repeat("y", 4097), mode: 0o600, wantErr: attest.ErrKeyTooLong},
		{name: "4096-byte key and newline", content: strings.Repeat("z", 4096) + "\n", mode: 0o600, wantErr: attest.ErrKeyTooLong},
		{name: "1 MiB file", content: strings.Repeat("w", 1<<20), mode: 0o600, wantErr: attest.ErrKeyTooLong},
		{name: "world readable", content: testKey, mode: 0o644, wantErr: attest.ErrKeyFileMode, errText: "mode 0644"},
		{name: "group readable", content: testKey, mode: 0o640, wantErr: attest.ErrKeyFileMode, errText: "mode 0640"},
		{name: "others readable", content: testKey, mode: 0o604, wantErr: attest.ErrKeyFileMode, errText: "mode 0604"},
		{name: "group writable", content: testKey, mode: 0o620, wantErr: attest.ErrKeyFileMode, errText: "mode 0620"},
		{name: "others executable", content: testKey, mode: 0o601, wantErr: attest.ErrKeyFileMode, errText: "mode 0601"},
		{name: "invalid UTF-8", content: "\xff\xfe" + testKey, mode: 0o600, errText: "not valid UTF-8"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeKey(t, tc.content, tc.mode)
			k, err := attest.LoadKeyFile(path)
			if tc.wantKey != "" {
				if err != nil {
					t.Fatalf("LoadKeyFile: %v", err)
				}
				want, err := attest.NewKeyring([]byte(tc.wantKey))
				if err != nil {
					t.Fatal(err)
				}
				c := testClaims()
				if got, want := k.LeaseToken(c), want.LeaseToken(c); got != want {
					t.Errorf("loaded key signs %q, want %q", got, want)
				}
				return
			}
			if err == nil || k != nil {
				t.Fatalf("LoadKeyFile = %v, %v; want an error", k, err)
			}
			msg := err.Error()
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("error %q does not match %v", msg, tc.wantErr)
			}
			if !strings.Contains(msg, path) {
				t.Errorf("error %q does not name the path %s", msg, path)
			}
			if !strings.Contains(msg, tc.errText) {
				t.Errorf("error %q does not contain %q", msg, tc.errText)
			}
			if errors.Is(err, attest.ErrKeyFileMode) && !strings.Contains(msg, "chmod 600 "+path) {
				t.Errorf("error %q does not give the fix", msg)
			}
			if k := strings.TrimSpace(tc.content); len(k) >= 8 && strings.Contains(msg, k[:8]) {
				t.Errorf("error %q contains key text", msg)
			}
		})
	}
}

func TestLoadKeyFileNotFound(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing")
	_, err := attest.LoadKeyFile(path)
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), path) {
		t.Errorf("LoadKeyFile(missing) = %v, want fs.ErrNotExist naming the path", err)
	}
}

func TestLoadKeyFileNotRegular(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	_, err := attest.LoadKeyFile(dir)
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("LoadKeyFile(directory) = %v, want a not-regular-file error", err)
	}
}

func TestLoadKeyFileFollowsSymlink(t *testing.T) {
	// Mounted secrets are often symbolic links to the real file.
	target := writeKey(t, testKey+"\n", 0o600)
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(target, link); err != nil {
		t.Skip(err)
	}
	k, err := attest.LoadKeyFile(link)
	if err != nil {
		t.Fatal(err)
	}
	if got := k.SignRelease(lease.Release{ReleaseSetID: testReleaseID, RuntimeClass: "kata_microvm", PolicyDigest: testPolicy}); got != kataSignature {
		t.Errorf("SignRelease = %q, want %q", got, kataSignature)
	}
}

func TestGenerateKeyFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "signing-key")
	if err := attest.GenerateKeyFile(path); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 || perm&0o400 == 0 {
		t.Errorf("generated key file has mode %04o, want 0600", perm)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := string(data)
	if len(text) != 65 || text[64] != '\n' || strings.Trim(text[:64], "0123456789abcdef") != "" {
		t.Errorf("generated key file holds %d bytes, want 64 lowercase hex characters and a newline", len(text))
	}
	if _, err := attest.LoadKeyFile(path); err != nil {
		t.Errorf("LoadKeyFile(generated) = %v", err)
	}

	// An existing path is refused and left untouched.
	err = attest.GenerateKeyFile(path)
	if !errors.Is(err, fs.ErrExist) {
		t.Errorf("GenerateKeyFile(existing) = %v, want fs.ErrExist", err)
	}
	if again, _ := os.ReadFile(path); string(again) != text {
		t.Error("GenerateKeyFile(existing) changed the file")
	}

	// So is a symbolic link, even a dangling one.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(filepath.Join(t.TempDir(), "target"), link); err == nil {
		if err := attest.GenerateKeyFile(link); !errors.Is(err, fs.ErrExist) {
			t.Errorf("GenerateKeyFile(dangling symlink) = %v, want fs.ErrExist", err)
		}
	}

	// Two generated keys differ.
	other := filepath.Join(t.TempDir(), "other")
	if err := attest.GenerateKeyFile(other); err != nil {
		t.Fatal(err)
	}
	if data2, _ := os.ReadFile(other); string(data2) == text {
		t.Error("two generated keys are equal")
	}
}

func TestKeyringConcurrentUse(t *testing.T) {
	k := testKeyring(t)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if got := k.LeaseToken(testClaims()); got != testToken {
					t.Errorf("LeaseToken = %q, want %q", got, testToken)
					return
				}
				if !k.VerifyRelease(lease.Release{ReleaseSetID: testReleaseID, RuntimeClass: "kata_microvm", PolicyDigest: testPolicy, Signature: kataSignature}) {
					t.Error("VerifyRelease = false")
					return
				}
			}
		})
	}
	wg.Wait()
}

func BenchmarkLeaseToken(b *testing.B) {
	k := testKeyring(b)
	c := testClaims()
	b.ReportAllocs()
	for b.Loop() {
		k.LeaseToken(c)
	}
}

func BenchmarkVerifyRelease(b *testing.B) {
	k := testKeyring(b)
	b.ReportAllocs()
	for b.Loop() {
		if !k.VerifyRelease(lease.Release{ReleaseSetID: testReleaseID, RuntimeClass: "kata_microvm", PolicyDigest: testPolicy, Signature: kataSignature}) {
			b.Fatal("VerifyRelease = false")
		}
	}
}
