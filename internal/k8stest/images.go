package k8stest

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// busyboxPath is Debian busybox-static's binary.
const busyboxPath = "/bin/busybox"

type ociImage = v1.Image

// tarFile is one entry of a layer.
type tarFile struct {
	name     string
	mode     int64
	body     []byte
	linkname string // a symlink when set
	dir      bool
}

// layerImage returns a one-layer OCI image of files with the given
// entrypoint.
func layerImage(files []tarFile, entrypoint []string) (v1.Image, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Size: int64(len(f.body)), Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		switch {
		case f.dir:
			h.Typeflag, h.Size = tar.TypeDir, 0
		case f.linkname != "":
			h.Typeflag, h.Linkname, h.Size = tar.TypeSymlink, f.linkname, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.body); err != nil {
				return nil, err
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(mutate.MediaType(mutate.ConfigMediaType(empty.Image, types.OCIConfigJSON), types.OCIManifestSchema1), layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture, cf.OS = runtime.GOARCH, "linux"
	cf.Config.Entrypoint = entrypoint
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	cf.Config.WorkingDir = "/"
	return mutate.ConfigFile(img, cf)
}

// BusyboxImage returns the image BusyboxImageName names on a real node:
// Debian's busybox-static as /bin/busybox with a symlink per applet,
// /etc/passwd and /etc/group, and empty /tmp, /proc, /sys, /dev and /root.
// Its digest is the same for the same busybox binary.
func BusyboxImage() (v1.Image, error) {
	bb, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, err
	}
	out, err := exec.Command(busyboxPath, "--list").Output()
	if err != nil {
		return nil, err
	}
	files := []tarFile{}
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", "root"} {
		files = append(files, tarFile{name: d + "/", mode: 0o755, dir: true})
	}
	files = append(files,
		tarFile{name: "bin/busybox", mode: 0o755, body: bb},
		tarFile{name: "etc/passwd", mode: 0o644, body: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")},
		tarFile{name: "etc/group", mode: 0o644, body: []byte("root:x:0:\nnobody:x:65534:\n")},
	)
	for _, a := range strings.Fields(string(out)) {
		if a == "busybox" || strings.Contains(a, "/") {
			continue
		}
		files = append(files, tarFile{name: "bin/" + a, mode: 0o777, linkname: "busybox"})
	}
	return layerImage(files, nil)
}

// pauseImage packs the pause binary (scripts/k8s/pause) as the Pods'
// sandbox image.
func pauseImage(bin string) (v1.Image, error) {
	b, err := os.ReadFile(bin)
	if err != nil {
		return nil, err
	}
	return layerImage([]tarFile{{name: "pause", mode: 0o755, body: b}}, []string{"/pause"})
}

// writeOCIArchive writes img as an OCI archive (a tar of an OCI layout)
// whose index names it name, for `ctr images import`, and returns its
// manifest digest.
func writeOCIArchive(path, name string, img v1.Image) (string, error) {
	dir, err := os.MkdirTemp(filepath.Dir(path), "oci-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return "", err
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{
		"io.containerd.image.name":          name,
		"org.opencontainers.image.ref.name": name[strings.LastIndex(name, ":")+1:],
	})); err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	f, err := os.Create(path)
	if err != nil {
		return "", err
	}
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := e.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		h.Name = rel
		if e.IsDir() {
			h.Name += "/"
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if e.Type().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			_, err = tw.Write(b)
			return err
		}
		return nil
	})
	if cerr := tw.Close(); err == nil {
		err = cerr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return d.String(), err
}
