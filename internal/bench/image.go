package bench

import (
	"archive/tar"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/gvisor"
	"github.com/sandboxwich/sandboxwich/egress"
)

// ImageReport is R9: a cold provision of a gVisor cell whose root is a
// cached image (a shared copy under a private in-memory layer) against a
// cold provision from the same root filesystem as a plain directory.
type ImageReport struct {
	// Image and Dir are Provision (created, started, agent answering) of
	// a cell from the cached image and from the directory.
	Image Stats `json:"cached_image_provision"`
	Dir   Stats `json:"directory_provision"`
	// Ratio is R9: Image over Dir at p50.
	Ratio float64 `json:"ratio"`
	// PullMS is the first pull and unpack of the busybox image from the
	// loopback registry.
	PullMS float64 `json:"first_pull_unpack_ms"`
	// LargeBytes and LargePullMS are the first pull and unpack of an image
	// with an incompressible layer of about 200 MiB (not with Quick).
	LargeBytes  int64   `json:"large_image_bytes,omitempty"`
	LargePullMS float64 `json:"large_first_pull_unpack_ms,omitempty"`
	// CacheBytes is the disk the unpacked image takes once; each further
	// cell of it adds none (its writes live in its memory).
	CacheBytes int64 `json:"cache_bytes"`
}

// benchImage measures R9 when a static busybox is installed
// (scripts/install-busybox.sh); nil without one.
func benchImage(ctx context.Context, dir string, quick bool) (*ImageReport, error) {
	if _, err := os.Stat(busybox); err != nil {
		return nil, nil
	}
	n := 10
	if quick {
		n = 4
	}
	root := filepath.Join(dir, "r9-rootfs")
	if err := busyboxRoot(root, busybox); err != nil {
		return nil, err
	}
	host, closeRegistry := loopbackRegistry()
	defer closeRegistry()
	ref, err := pushDir(host+"/bench/busybox", root)
	if err != nil {
		return nil, err
	}
	stateDir := filepath.Join(dir, "runsc-r9-"+uuid.NewString()[:8])
	defer func() { _ = gvisor.RemoveStateDir(stateDir) }()
	base := gvisor.Config{StateDir: stateDir, BundleDir: filepath.Join(dir, "bundles-r9"),
		Installation: driver.InstallationTag(stateDir), Logger: slog.New(slog.DiscardHandler)}
	dirCfg, imgCfg := base, base
	dirCfg.Pool, dirCfg.RootFS = "r9-dir", root
	imgCfg.Pool, imgCfg.Image, imgCfg.ImageCacheDir = "r9-image", ref, filepath.Join(dir, "images")
	fromDir, err := gvisor.New(dirCfg)
	if err != nil {
		return nil, err
	}
	fromImage, err := gvisor.New(imgCfg)
	if err != nil {
		return nil, err
	}
	rep := &ImageReport{}
	t0 := time.Now()
	if err := fromImage.PullImage(ctx); err != nil {
		return nil, err
	}
	rep.PullMS = ms(time.Since(t0))
	rep.CacheBytes, _ = duBytes(filepath.Join(dir, "images"))

	t, err := inTurns(n, func() (time.Duration, error) {
		d, err := provisionOnce(ctx, fromDir, egress.None)
		if err != nil {
			err = fmt.Errorf("provision from the directory: %w", err)
		}
		return d, err
	}, func() (time.Duration, error) {
		d, err := provisionOnce(ctx, fromImage, egress.None)
		if err != nil {
			err = fmt.Errorf("provision from the image: %w", err)
		}
		return d, err
	})
	if err != nil {
		return nil, err
	}
	rep.Dir, rep.Image = summarize(t[0], 0, 0), summarize(t[1], 0, 0)
	rep.Ratio = ratio(rep.Image.P50MS, rep.Dir.P50MS)

	if !quick {
		large := filepath.Join(dir, "r9-large")
		if err := os.MkdirAll(large, 0o755); err != nil {
			return nil, err
		}
		if err := randomFile(filepath.Join(large, "blob"), 200<<20); err != nil {
			return nil, err
		}
		lref, err := pushDir(host+"/bench/large", large)
		_ = os.RemoveAll(large)
		if err != nil {
			return nil, err
		}
		lcfg := base
		lcfg.Pool, lcfg.Image, lcfg.ImageCacheDir = "r9-large", lref, filepath.Join(dir, "images-large")
		lp, err := gvisor.New(lcfg)
		if err != nil {
			return nil, err
		}
		t0 := time.Now()
		if err := lp.PullImage(ctx); err != nil {
			return nil, err
		}
		rep.LargePullMS = ms(time.Since(t0))
		rep.LargeBytes, _ = duBytes(filepath.Join(dir, "images-large"))
		_ = os.RemoveAll(filepath.Join(dir, "images-large"))
	}
	return rep, nil
}

// inTurns runs fns one after the other, in order, n+1 times, and returns
// each one's n times after the first round, which only warms runsc's and
// the page cache: series that take turns see the machine at the same
// moments, which is what makes their ratio mean something on a shared
// machine. The first error ends it.
func inTurns(n int, fns ...func() (time.Duration, error)) ([][]time.Duration, error) {
	out := make([][]time.Duration, len(fns))
	for i := range n + 1 {
		for j, fn := range fns {
			d, err := fn()
			if err != nil {
				return nil, err
			}
			if i > 0 {
				out[j] = append(out[j], d)
			}
		}
	}
	return out, nil
}

// busybox is the static busybox of scripts/install-busybox.sh, whose
// root filesystems the image figures push.
const busybox = "/bin/busybox"

// loopbackRegistry serves an OCI registry (go-containerregistry's) on
// loopback until closeRegistry is called; host is its host:port.
func loopbackRegistry() (host string, closeRegistry func()) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	return strings.TrimPrefix(srv.URL, "http://"), srv.Close
}

// busyboxRoot lays out a root filesystem of a static busybox alone.
func busyboxRoot(root, busybox string) error {
	if err := os.MkdirAll(filepath.Join(root, "bin"), 0o755); err != nil {
		return err
	}
	b, err := os.ReadFile(busybox)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(root, "bin", "busybox"), b, 0o755); err != nil {
		return err
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return err
	}
	for _, applet := range strings.Fields(string(out)) {
		if applet != "busybox" {
			if err := os.Symlink("busybox", filepath.Join(root, "bin", applet)); err != nil {
				return err
			}
		}
	}
	return nil
}

// pushDir pushes an image of one layer holding dir's tree to repo and
// returns its reference pinned by digest.
func pushDir(repo, dir string) (string, error) {
	tarPath := dir + ".tar"
	if err := tarDir(tarPath, dir); err != nil {
		return "", err
	}
	defer os.Remove(tarPath)
	layer, err := tarball.LayerFromFile(tarPath)
	if err != nil {
		return "", err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	tag, err := name.NewTag(repo + ":bench")
	if err != nil {
		return "", err
	}
	if err := remote.Write(tag, img); err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return repo + "@" + d.String(), nil
}

// tarDir writes dir's tree as an uncompressed tar.
func tarDir(path, dir string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || p == dir {
			return err
		}
		link := ""
		if fi.Mode()&os.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = strings.TrimPrefix(p, dir+"/")
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if fi.Mode().IsRegular() {
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			_, err = io.Copy(tw, in)
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}

func randomFile(path string, size int64) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// duBytes is the apparent size of the files under dir.
func duBytes(dir string) (int64, error) {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return err
	})
	return n, err
}
