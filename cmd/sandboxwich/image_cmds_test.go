package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/internal/testenv/fakecache"
	"github.com/sandboxwich/sandboxwich/internal/testenv/testserver"
	"github.com/sandboxwich/sandboxwich/wire"
)

// TestCLIImages: images prefetch prints each image's state, images list
// the pool's images (a table, or the wire answer with --json); usage
// errors exit 2, refusals 1 with their code; the inventory shows the image
// class's images and cached count.
func TestCLIImages(t *testing.T) {
	prov := fakecache.New(fakecache.NewCache("images"))
	s := testserver.StartImageClass(t, prov, 2, "registry.test/swe/*")
	te := newCLITestEnv(s.URL)
	a := "registry.test/swe/task-a@sha256:" + strings.Repeat("a", 64)
	b := "registry.test/swe/task-b@sha256:" + strings.Repeat("b", 64)

	release := prov.Hold()
	if code := te.run("images", "prefetch", "--pool", cliTestPool, a, b); code != 0 {
		t.Fatalf("images prefetch: exit %d\n%s", code, te.stderr)
	}
	if got, want := fields(te.stdout.String()), []string{"IMAGE STATE BYTES CODE", a + " queued - -", b + " queued - -"}; strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("images prefetch printed\n%s", te.stdout)
	}
	release()
	var list wire.ImagesResponse
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if code := te.run("images", "list", "--pool", cliTestPool, "--json"); code != 0 {
			t.Fatalf("images list --json: exit %d\n%s", code, te.stderr)
		}
		if err := json.Unmarshal(te.stdout.Bytes(), &list); err != nil {
			t.Fatalf("images list --json printed %s: %v", te.stdout, err)
		}
		if len(list.Images) == 2 && list.Images[0].State == wire.ImageCached && list.Images[1].State == wire.ImageCached {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("images list --json: %s", te.stdout)
		}
	}
	if !list.OK || list.Pool != cliTestPool || list.Images[0].Image != a || list.Images[0].Bytes == nil {
		t.Errorf("images list --json: %s", te.stdout)
	}
	if code := te.run("images", "list", "--pool", cliTestPool); code != 0 ||
		strings.Join(fields(te.stdout.String()), "\n") != strings.Join([]string{"IMAGE STATE BYTES CODE", a + " cached 100 -", b + " cached 100 -"}, "\n") {
		t.Errorf("images list: exit %d\n%s%s", code, te.stdout, te.stderr)
	}

	for _, args := range [][]string{
		{"images"}, {"images", "pull"}, {"images", "prefetch", "--pool", cliTestPool}, {"images", "prefetch", a},
		{"images", "list"}, {"images", "list", "--pool", cliTestPool, "extra"},
	} {
		if code := te.run(args...); code != 2 {
			t.Errorf("%q: exit %d, want 2\n%s", args, code, te.stderr)
		}
	}
	if code := te.run("images", "-h"); code != 0 || !strings.Contains(te.stderr.String(), "images prefetch --pool POOL") {
		t.Errorf("images -h: exit %d\n%s", code, te.stderr)
	}
	if code := te.run("help", "images"); code != 0 || !strings.Contains(te.stderr.String(), "images list --pool POOL") {
		t.Errorf("help images: exit %d\n%s", code, te.stderr)
	}
	if code := te.run("images", "prefetch", "-h"); code != 0 || !strings.Contains(te.stderr.String(), "-pool") {
		t.Errorf("images prefetch -h: exit %d\n%s", code, te.stderr)
	}
	other := "registry.test/other/x@sha256:" + strings.Repeat("c", 64)
	if code := te.run("images", "prefetch", "--pool", cliTestPool, other); code != 1 || !strings.Contains(te.stderr.String(), "image_not_allowed") {
		t.Errorf("a prefetch of an image the pool does not allow: exit %d\n%s", code, te.stderr)
	}
	if code := te.run("images", "list", "--pool", "nope", "--json"); code != 1 || cliEnvelope(t, te).Code != "not_found" {
		t.Errorf("images list of an unknown pool: exit %d\n%s", code, te.stdout)
	}

	if code := te.run("inventory"); code != 0 {
		t.Fatalf("inventory: exit %d\n%s", code, te.stderr)
	}
	lines := fields(te.stdout.String())
	if len(lines) != 2 || lines[0] != "RELEASE_SET_ID RUNTIME_CLASS POLICY_DIGEST READY MAX_LEASE_SECONDS IMAGES CACHED" ||
		!strings.HasSuffix(lines[1], " 0 0 registry.test/swe/* 2") {
		t.Errorf("inventory:\n%s", te.stdout)
	}
}

// fields returns the lines of a table, each with its columns joined by one
// space.
func fields(table string) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(table), "\n") {
		out = append(out, strings.Join(strings.Fields(l), " "))
	}
	return out
}
