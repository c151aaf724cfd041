package sandboxwich_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestLightImport keeps `go get` cheap: a harness that imports the root
// package, store/sqlite and client links no Kubernetes, Cloudflare or
// test-harness code. If this ever cannot hold, split modules instead of
// weakening the test.
func TestLightImport(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go is required under CI=true: %v", err)
		}
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-deps",
		"github.com/sandboxwich/sandboxwich",
		"github.com/sandboxwich/sandboxwich/store/sqlite",
		"github.com/sandboxwich/sandboxwich/client").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 20 {
		t.Fatalf("go list -deps listed only %d packages: %q", len(deps), deps)
	}
	heavy := []string{
		"k8s.io/",                           // client-go, apimachinery, api
		"sigs.k8s.io/",                      // controller-runtime, structured-merge-diff
		"github.com/cloudflare/",            // cloudflare-go
		"github.com/anishathalye/porcupine", // the reliability harness
		"github.com/google/go-containerregistry",
	}
	for _, d := range deps {
		for _, h := range heavy {
			if strings.HasPrefix(d, h) {
				t.Errorf("the light import links %s", d)
			}
		}
	}
}

// TestCloudflareNarrowImport: importing driver/cloudflare links
// cloudflare-go, but only its narrow packages (workers, durable_objects
// and what they need), never the root client, which links every one of
// its 117 packages (ten minutes of compilation on a loaded two-core CI
// machine against half a minute for these).
func TestCloudflareNarrowImport(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go is required under CI=true: %v", err)
		}
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-deps", "github.com/sandboxwich/sandboxwich/driver/cloudflare").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var cf []string
	for _, d := range strings.Fields(string(out)) {
		if strings.HasPrefix(d, "github.com/cloudflare/cloudflare-go/") {
			cf = append(cf, d)
		}
	}
	for _, want := range []string{"github.com/cloudflare/cloudflare-go/v6/workers", "github.com/cloudflare/cloudflare-go/v6/durable_objects"} {
		if !slices.Contains(cf, want) {
			t.Errorf("driver/cloudflare does not link %s: %q", want, cf)
		}
	}
	if slices.Contains(cf, "github.com/cloudflare/cloudflare-go/v6") {
		t.Errorf("driver/cloudflare links cloudflare-go's root client")
	}
	if len(cf) > 20 {
		t.Errorf("driver/cloudflare links %d cloudflare-go packages, want the narrow few: %q", len(cf), cf)
	}
}
