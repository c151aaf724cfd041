package k8stest

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Registry is an OCI registry on loopback (go-containerregistry's, the
// distribution protocol a real pull speaks) that the node's containerd
// pulls from: containerd's hosts.toml for Host mirrors it over plain HTTP.
// Pods name images Host/repo@sha256:…, and the kubelet reports that repo
// digest as status.containerStatuses[].imageID.
type Registry struct {
	// Host is the registry name Pods use (a name under .invalid that
	// only the node's containerd configuration resolves).
	Host string
	// Fault, when set, may answer a request itself (returning true).
	Fault atomic.Pointer[func(w http.ResponseWriter, r *http.Request) bool]

	srv *httptest.Server
}

var registries atomic.Int64

// Registry starts a registry for the node and removes it at the test's
// cleanup.
func (n *Node) Registry(tb testing.TB) *Registry {
	tb.Helper()
	reg := &Registry{Host: fmt.Sprintf("reg%d.k8stest.invalid", registries.Add(1))}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if f := reg.Fault.Load(); f != nil && (*f)(w, r) {
			return
		}
		h.ServeHTTP(w, r)
	}))
	dir := filepath.Join(n.work, "containerd", "certs.d", reg.Host)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		tb.Fatal(err)
	}
	hosts := fmt.Sprintf("server = %q\n\n[host.%q]\n  capabilities = [\"pull\", \"resolve\"]\n", reg.srv.URL, reg.srv.URL)
	if err := os.WriteFile(filepath.Join(dir, "hosts.toml"), []byte(hosts), 0o644); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		reg.srv.Close()
		_ = os.RemoveAll(dir)
	})
	return reg
}

// Push writes img as repo:latest and returns its reference pinned by
// digest under Host.
func (reg *Registry) Push(tb testing.TB, repo string, img v1.Image) string {
	tb.Helper()
	tag, err := name.NewTag(strings.TrimPrefix(reg.srv.URL, "http://") + "/" + repo + ":latest")
	if err != nil {
		tb.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		tb.Fatalf("pushing %s: %v", tag, err)
	}
	d, err := img.Digest()
	if err != nil {
		tb.Fatal(err)
	}
	return reg.Host + "/" + repo + "@" + d.String()
}
