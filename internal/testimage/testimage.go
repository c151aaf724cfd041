// Package testimage builds the small OCI images the tests run cells of —
// a static busybox alone, and the host's python3 with its C library and
// standard library — and serves them from go-containerregistry's registry
// on loopback, the OCI distribution API a real pull speaks.
package testimage

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one entry of a layer.
type Entry struct {
	Name, Body, Link string
	Type             byte  // tar.TypeReg when zero
	Mode             int64 // 0644 for files, 0755 for directories, when zero
}

// Layer builds a gzip layer of the entries, in order.
func Layer(entries ...Entry) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Link, Size: int64(len(e.Body))}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, e.Body); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
}

// Busybox is a layer of the static busybox at path alone (no C library):
// /bin/busybox, a symlink per applet, and an /etc/passwd naming root and
// cell.
func Busybox(path string) (v1.Layer, error) {
	bin, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(path, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", path, err)
	}
	entries := []Entry{{Name: "bin/", Type: tar.TypeDir}, {Name: "bin/busybox", Body: string(bin), Mode: 0o755},
		{Name: "etc/", Type: tar.TypeDir}, {Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\ncell:x:1000:1000:cell:/home/cell:/bin/sh\n"},
		{Name: "etc/image-release", Body: "busybox test image\n"}}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" {
			entries = append(entries, Entry{Name: "bin/" + applet, Type: tar.TypeSymlink, Link: "busybox"})
		}
	}
	return Layer(entries...)
}

// ErrNoPython is HostPython's error on a host without /usr/bin/python3.
var ErrNoPython = errors.New("testimage: the host has no /usr/bin/python3")

// HostPython is a layer of the host's python3: the interpreter, the shared
// libraries ldd names for it (at their paths) and its standard library
// without tests, caches and installed packages.
func HostPython() (v1.Layer, error) {
	bin, err := filepath.EvalSymlinks("/usr/bin/python3")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoPython, err)
	}
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		return nil, fmt.Errorf("ldd %s: %w", bin, err)
	}
	files := []string{bin}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[1] == "=>" && strings.HasPrefix(f[2], "/"):
			files = append(files, f[2])
		case len(f) >= 1 && strings.HasPrefix(f[0], "/"):
			files = append(files, f[0]) // the dynamic loader
		}
	}
	stdlib := filepath.Join("/usr/lib", filepath.Base(bin))
	skip := map[string]bool{"test": true, "__pycache__": true, "site-packages": true, "dist-packages": true, "idlelib": true,
		"tkinter": true, "ensurepip": true, "lib2to3": true, "pydoc_data": true}
	err = filepath.WalkDir(stdlib, func(path string, d fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case d.IsDir() && skip[d.Name()]:
			return filepath.SkipDir
		case d.Type().IsRegular():
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	var entries []Entry
	dirs := map[string]bool{}
	for _, f := range files {
		real, err := filepath.EvalSymlinks(f)
		if err != nil {
			return nil, err
		}
		b, err := os.ReadFile(real)
		if err != nil {
			return nil, err
		}
		rel := strings.TrimPrefix(f, "/")
		for d := filepath.Dir(rel); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
		entries = append(entries, Entry{Name: rel, Body: string(b), Mode: 0o755})
	}
	var dirEntries []Entry
	for d := range dirs {
		dirEntries = append(dirEntries, Entry{Name: d + "/", Type: tar.TypeDir})
	}
	slices.SortFunc(dirEntries, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	return Layer(append(dirEntries, append(entries, Entry{Name: "usr/bin/python3", Type: tar.TypeSymlink, Link: filepath.Base(bin)})...)...)
}

// Image is an image of the layers, bottom first.
func Image(layers ...v1.Layer) (v1.Image, error) { return mutate.AppendLayers(empty.Image, layers...) }

// Marked is an image of a static busybox (Busybox of the binary at
// busybox) and a layer holding /etc/marker that says "marker <name>\n": a
// cell of it runs, and tells which image it is.
func Marked(busybox, name string) (v1.Image, error) {
	bb, err := Busybox(busybox)
	if err != nil {
		return nil, err
	}
	m, err := Layer(Entry{Name: "etc/", Type: tar.TypeDir}, Entry{Name: "etc/marker", Body: "marker " + name + "\n"})
	if err != nil {
		return nil, err
	}
	return Image(bb, m)
}

// Data is an image of one layer holding /data: size bytes made of name,
// so that images of other names differ and images of one size take about
// as much unpacked.
func Data(name string, size int) (v1.Image, error) {
	body := strings.Repeat(name, size/max(len(name), 1)+1)[:size]
	l, err := Layer(Entry{Name: "data", Body: body})
	if err != nil {
		return nil, err
	}
	return Image(l)
}

// StaticBusybox returns the static busybox the images of cells need,
// /bin/busybox, or an error that says how to install it.
func StaticBusybox() (string, error) {
	const path = "/bin/busybox"
	f, err := elf.Open(path)
	if err != nil {
		return "", fmt.Errorf("%s: %w (apt-get install busybox-static, or scripts/install-busybox.sh)", path, err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "", fmt.Errorf("%s is dynamically linked (apt-get install busybox-static, or scripts/install-busybox.sh)", path)
		}
	}
	return path, nil
}

// Registry is go-containerregistry's registry on a loopback port.
type Registry struct {
	// Host is its host:port, the registry part of the references it serves.
	Host string
	// Fault, when set, sees every request first and may answer it itself
	// (returning true): a fault the real registry cannot produce.
	Fault atomic.Pointer[func(w http.ResponseWriter, r *http.Request) bool]
	srv   *http.Server
}

// Serve starts a registry on 127.0.0.1. Close stops it.
func Serve() (*Registry, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &Registry{Host: ln.Addr().String()}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if f := r.Fault.Load(); f != nil && (*f)(w, req) {
			return
		}
		h.ServeHTTP(w, req)
	})}
	go r.srv.Serve(ln)
	return r, nil
}

// DropBlobs makes the registry cut every blob download after its first
// bytes (a registry dying mid-pull) until the returned function is called.
func (r *Registry) DropBlobs() (restore func()) {
	f := func(w http.ResponseWriter, req *http.Request) bool {
		if !strings.Contains(req.URL.Path, "/blobs/") || req.Method != http.MethodGet {
			return false
		}
		w.Header().Set("Content-Length", "1048576")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte{0x1f, 0x8b})
		panic(http.ErrAbortHandler) // the connection is cut
	}
	r.Fault.Store(&f)
	return func() { r.Fault.Store(nil) }
}

// Push writes img as repo:latest and returns its reference pinned by
// digest.
func (r *Registry) Push(repo string, img v1.Image) (string, error) {
	tag, err := name.NewTag(r.Host + "/" + repo + ":latest")
	if err != nil {
		return "", err
	}
	if err := remote.Write(tag, img); err != nil {
		return "", fmt.Errorf("pushing %s: %w", tag, err)
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return r.Host + "/" + repo + "@" + d.String(), nil
}

// Close stops the registry.
func (r *Registry) Close() error { return r.srv.Close() }
