package httpapi_test

import (
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// TestImports: of this module's packages, httpapi imports only the root
// package, wire, errcode, lease and egress — the Plane's own words and
// the nouns they are made of are its whole vocabulary (DESIGN "Direction of dependencies") — and of the others only
// the standard library, Prometheus and uuid.
func TestImports(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go is required under CI=true: %v", err)
		}
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-f", `{{join .Imports "\n"}}`, "github.com/sandboxwich/sandboxwich/httpapi").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/sandboxwich/sandboxwich"
	var ours []string
	for _, imp := range strings.Fields(string(out)) {
		switch {
		case imp == mod || strings.HasPrefix(imp, mod+"/"):
			ours = append(ours, imp)
		case !strings.Contains(strings.Split(imp, "/")[0], "."): // the standard library
		case imp == "github.com/google/uuid", strings.HasPrefix(imp, "github.com/prometheus/client_golang/"):
		default:
			t.Errorf("httpapi imports %s", imp)
		}
	}
	want := []string{mod, mod + "/egress", mod + "/errcode", mod + "/lease", mod + "/wire"}
	if !slices.Equal(ours, want) {
		t.Errorf("httpapi imports, of this module:\n%q\nwant\n%q", ours, want)
	}
}
