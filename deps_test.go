package sandboxwich_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// TestLightImport keeps `go get` cheap: a harness that imports the root
// package, store/sqlite and client (and, in its tests, planetest) links no
// Kubernetes, Cloudflare or test-harness code. If this ever cannot hold, split modules instead of
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
		"github.com/sandboxwich/sandboxwich/client",
		"github.com/sandboxwich/sandboxwich/planetest").Output()
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

// TestDependencyDirection keeps the "Direction of dependencies" paragraph of
// the design true on the real import graph (non-test imports of every
// package in the module):
//
//   - lease and errcode import nothing of ours; fence and attest only lease;
//     egress (the policy form) only errcode;
//   - agent (the protocol) only those; agent/cellagent only agent and those;
//   - store and driver (and their implementations) only the layers above,
//     and a driver never the root package or another driver (shared helpers
//     under driver/internal, and the egress gateway a driver runs, are
//     allowed);
//   - pool only store, driver and the layers above; the root package only
//     store, driver, pool and the layers above;
//   - httpapi, e2b, mcp and console only the root package, wire, errcode,
//     lease and egress — the Plane's own types and the nouns they are made
//     of are their vocabulary;
//   - wire only the pure cores; webhook only store, wire and those;
//   - client only the wire types and the nouns they are made of: wire,
//     errcode and lease (never the server side).
//
// A package under internal/ that imports nothing of ours (imageref,
// driver/internal/inflight) is a leaf helper any layer may use: it cannot
// carry a dependency upwards. Packages not named here (cmd, examples,
// internal test harnesses) wire everything and are not checked.
func TestDependencyDirection(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("go is required under CI=true: %v", err)
		}
		t.Skip("no go command")
	}
	out, err := exec.Command(goBin, "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	const mod = "github.com/sandboxwich/sandboxwich"
	short := func(p string) (string, bool) {
		if p == mod {
			return ".", true
		}
		rest, ok := strings.CutPrefix(p, mod+"/")
		return rest, ok
	}
	imports := map[string][]string{} // ours only, module-relative; "." is the root
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg, ok := short(f[0])
		if !ok {
			continue
		}
		imports[pkg] = []string{}
		for _, imp := range f[1:] {
			if s, ok := short(imp); ok {
				imports[pkg] = append(imports[pkg], s)
			}
		}
	}
	if len(imports) < 20 {
		t.Fatalf("go list listed only %d packages of the module", len(imports))
	}
	leaf := func(p string) bool {
		return (strings.HasPrefix(p, "internal/") || strings.Contains(p, "/internal/")) && len(imports[p]) == 0
	}
	under := func(p, root string) bool { return p == root || strings.HasPrefix(p, root+"/") }
	in := func(allowed ...string) func(string) bool {
		return func(p string) bool { return slices.Contains(allowed, p) }
	}
	pure := in("lease", "errcode", "fence", "attest", "egress")
	protocol := func(p string) bool { return pure(p) || p == "agent" }
	// isDriver reports whether p is a driver implementation (driver/<name>,
	// not the conformance suite or the shared helpers).
	isDriver := func(p string) bool {
		rest, ok := strings.CutPrefix(p, "driver/")
		return ok && !strings.Contains(rest, "/") && rest != "internal" && rest != "drivertest"
	}
	type rule struct {
		name    string
		applies func(pkg string) bool
		allowed func(pkg, imp string) bool
	}
	rules := []rule{
		{"lease and errcode import nothing of ours", in("lease", "errcode"),
			func(_, imp string) bool { return false }},
		{"fence and attest import only lease", in("fence", "attest"),
			func(_, imp string) bool { return imp == "lease" }},
		{"egress imports only errcode", in("egress"),
			func(_, imp string) bool { return imp == "errcode" }},
		{"egress/gateway imports only egress and errcode", in("egress/gateway"),
			func(_, imp string) bool { return imp == "egress" || imp == "errcode" }},
		{"agent imports only lease, errcode, fence and attest", in("agent"),
			func(_, imp string) bool { return pure(imp) }},
		{"agent/cellagent imports only agent and the pure cores", func(p string) bool { return under(p, "agent/cellagent") },
			func(_, imp string) bool { return protocol(imp) || under(imp, "agent/cellagent") }},
		{"store imports only the layers above it", func(p string) bool { return under(p, "store") },
			func(_, imp string) bool { return protocol(imp) || under(imp, "store") }},
		{"driver imports only the layers above it", func(p string) bool { return under(p, "driver") },
			func(pkg, imp string) bool {
				return protocol(imp) || imp == "driver" || under(imp, "driver/internal") || imp == "egress/gateway" || under(imp, pkg)
			}},
		{"drivers never import the root package or each other", isDriver,
			func(pkg, imp string) bool {
				return imp != "." && (!under(imp, "driver/") || under(imp, "driver/internal") || under(imp, pkg))
			}},
		{"pool imports only store, driver and the layers above", func(p string) bool { return under(p, "pool") },
			func(_, imp string) bool {
				return protocol(imp) || imp == "store" || imp == "driver" || under(imp, "pool")
			}},
		{"the root package imports only store, driver, pool and the layers above", in("."),
			func(_, imp string) bool { return protocol(imp) || imp == "store" || imp == "driver" || imp == "pool" }},
		{"httpapi, e2b, mcp and console import only the root package, wire, errcode, lease and egress",
			func(p string) bool {
				return under(p, "httpapi") || under(p, "e2b") || under(p, "mcp") || under(p, "console")
			},
			func(pkg, imp string) bool {
				return imp == "." || imp == "wire" || imp == "errcode" || imp == "lease" || imp == "egress" ||
					under(imp, strings.Split(pkg, "/")[0])
			}},
		{"wire imports only the pure cores", in("wire"),
			func(_, imp string) bool { return pure(imp) }},
		{"webhook imports only store, wire and the pure cores", func(p string) bool { return under(p, "webhook") },
			func(_, imp string) bool { return pure(imp) || imp == "store" || imp == "wire" || under(imp, "webhook") }},
		{"client imports only wire, errcode and lease", func(p string) bool { return under(p, "client") },
			func(_, imp string) bool {
				return imp == "wire" || imp == "errcode" || imp == "lease" || under(imp, "client")
			}},
	}
	pkgs := make([]string, 0, len(imports))
	for p := range imports {
		pkgs = append(pkgs, p)
	}
	slices.Sort(pkgs)
	for _, r := range rules {
		for _, pkg := range pkgs {
			if !r.applies(pkg) {
				continue
			}
			for _, imp := range imports[pkg] {
				if !leaf(imp) && !r.allowed(pkg, imp) {
					t.Errorf("%s: %s imports %s", r.name, pkg, imp)
				}
			}
		}
	}
}

// TestDocLinks keeps the documentation's relative links working: every
// link of README.md and docs/*.md that is not a URL names a file of the
// repository, and its #anchor, if any, a heading of that file.
func TestDocLinks(t *testing.T) {
	files, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "README.md")
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			resolved := f
			if path != "" {
				resolved = filepath.Join(filepath.Dir(f), path)
				if _, err := os.Stat(resolved); err != nil {
					t.Errorf("%s links %s: no such file", f, target)
					continue
				}
			}
			checked++
			if anchor == "" {
				continue
			}
			doc, err := os.ReadFile(resolved)
			if err != nil {
				t.Errorf("%s links %s: %v", f, target, err)
				continue
			}
			if !slices.Contains(headingAnchors(string(doc)), anchor) {
				t.Errorf("%s links %s: %s has no heading #%s", f, target, resolved, anchor)
			}
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the pattern is wrong")
	}
}

// headingAnchors returns the anchors GitHub gives the Markdown headings of
// doc: lower case, spaces as hyphens, punctuation other than hyphens and
// underscores dropped.
func headingAnchors(doc string) []string {
	var anchors []string
	inCode := false
	for _, line := range strings.Split(doc, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		if inCode || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimSpace(strings.TrimLeft(line, "#"))
		var b strings.Builder
		for _, r := range strings.ToLower(title) {
			switch {
			case r == ' ':
				b.WriteRune('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		anchors = append(anchors, b.String())
	}
	return anchors
}
