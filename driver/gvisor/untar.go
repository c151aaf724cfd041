package gvisor

import (
	"archive/tar"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// OCI whiteouts (image-spec layer.md): ".wh.<name>" removes <name> of the
// lower layers; ".wh..wh..opq" in a directory removes everything the lower
// layers put in it.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// applyLayer applies one uncompressed layer tar (open returns a fresh
// reader of it) to the root directory: its whiteouts first, which only
// affect lower layers, then its entries. Every entry name is resolved
// inside root without following a symlink: a name with "..", or one whose
// parent is a symlink, is refused, as is a hard link to outside root.
// Device nodes and FIFOs are skipped (a cell's /dev is gVisor's own).
//
// The regular files' sizes are taken from b first: a layer that would
// write more than b has left fails before it writes the file.
func applyLayer(open func() (io.ReadCloser, error), root string, b *budget) error {
	if err := eachEntry(open, func(h *tar.Header, rel string, _ io.Reader) error {
		dir, base := path.Split(rel)
		switch {
		case base == whiteoutOpaque:
			parent, err := resolve(root, strings.TrimSuffix(dir, "/"), false)
			if err != nil || parent == "" {
				return err
			}
			entries, err := os.ReadDir(parent)
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			if err != nil {
				return err
			}
			for _, e := range entries {
				if err := os.RemoveAll(filepath.Join(parent, e.Name())); err != nil {
					return err
				}
			}
		case strings.HasPrefix(base, whiteoutPrefix):
			target, err := resolve(root, dir+strings.TrimPrefix(base, whiteoutPrefix), false)
			if err != nil || target == "" {
				return err
			}
			return os.RemoveAll(target)
		}
		return nil
	}); err != nil {
		return err
	}
	return eachEntry(open, func(h *tar.Header, rel string, r io.Reader) error {
		if strings.HasPrefix(path.Base(rel), whiteoutPrefix) {
			return nil
		}
		if h.Typeflag == tar.TypeReg {
			if err := b.take(h.Size); err != nil {
				return err
			}
		}
		return writeEntry(root, rel, h, r)
	})
}

// budget is what an unpack may still write, in bytes of regular files,
// of max set by setting (image_max_bytes when "").
type budget struct {
	left, max int64
	setting   string
}

func (b *budget) take(n int64) error {
	if n < 0 || n > b.left {
		return &unpackLimitError{max: b.max, setting: cmp.Or(b.setting, "image_max_bytes")}
	}
	b.left -= n
	return nil
}

// unpackLimitError is an unpack that would write more than its budget.
type unpackLimitError struct {
	max     int64
	setting string
}

func (e *unpackLimitError) Error() string {
	return fmt.Sprintf("the image unpacks to more than %s (%d bytes): refused", e.setting, e.max)
}

// eachEntry calls fn for every entry of the tar with its cleaned name
// relative to the root ("." entries are skipped). A name that climbs out
// of the root is an error.
func eachEntry(open func() (io.ReadCloser, error), fn func(h *tar.Header, rel string, r io.Reader) error) error {
	rc, err := open()
	if err != nil {
		return err
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the layer: %w", err)
		}
		rel, err := entryName(h.Name)
		if err != nil {
			return err
		}
		if rel == "" {
			continue
		}
		if err := fn(h, rel, tr); err != nil {
			return fmt.Errorf("entry %q: %w", h.Name, err)
		}
	}
}

// entryName cleans a tar entry name into a path relative to the root, ""
// for the root itself. Names with a ".." component are refused.
func entryName(n string) (string, error) {
	s := strings.TrimLeft(n, "/")
	for _, part := range strings.Split(s, "/") {
		if part == ".." {
			return "", fmt.Errorf("entry %q climbs out of the root filesystem: refused", n)
		}
	}
	s = path.Clean(s)
	if s == "." || s == "" {
		return "", nil
	}
	if strings.Contains(s, "\x00") {
		return "", fmt.Errorf("entry %q has a NUL byte: refused", n)
	}
	return s, nil
}

// resolve returns root/rel after checking that no existing parent of it
// is anything but a real directory (a symlink there could point out of
// the root). Missing parents are created when create is set; otherwise a
// missing parent returns "" (nothing to act on).
func resolve(root, rel string, create bool) (string, error) {
	if rel == "" || rel == "." {
		return root, nil
	}
	parts := strings.Split(rel, "/")
	cur := root
	for _, part := range parts[:len(parts)-1] {
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		switch {
		case errors.Is(err, os.ErrNotExist):
			if !create {
				return "", nil
			}
			if err := os.Mkdir(cur, 0o755); err != nil {
				return "", err
			}
		case err != nil:
			return "", err
		case fi.Mode()&os.ModeSymlink != 0:
			return "", fmt.Errorf("parent %q is a symlink: refused", strings.TrimPrefix(cur, root+"/"))
		case !fi.IsDir():
			if !create {
				return "", nil
			}
			return "", fmt.Errorf("parent %q is not a directory", strings.TrimPrefix(cur, root+"/"))
		}
	}
	return filepath.Join(cur, parts[len(parts)-1]), nil
}

// writeEntry creates one entry under root, replacing what lower layers had
// there (a directory over a directory keeps its content).
func writeEntry(root, rel string, h *tar.Header, r io.Reader) error {
	target, err := resolve(root, rel, true)
	if err != nil {
		return err
	}
	mode := os.FileMode(h.Mode & 0o7777)
	perm := mode & os.ModePerm
	if mode&0o4000 != 0 {
		perm |= os.ModeSetuid
	}
	if mode&0o2000 != 0 {
		perm |= os.ModeSetgid
	}
	if mode&0o1000 != 0 {
		perm |= os.ModeSticky
	}
	existing, err := os.Lstat(target)
	if err == nil && !(h.Typeflag == tar.TypeDir && existing.IsDir()) {
		if err := os.RemoveAll(target); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(target, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return err
		}
	case tar.TypeReg:
		f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	case tar.TypeSymlink:
		if err := os.Symlink(h.Linkname, target); err != nil {
			return err
		}
		return lchown(target, h)
	case tar.TypeLink:
		linkRel, err := entryName(h.Linkname)
		if err != nil || linkRel == "" {
			return fmt.Errorf("hard link to %q: refused", h.Linkname)
		}
		src, err := resolve(root, linkRel, false)
		if err != nil {
			return err
		}
		if src == "" {
			return fmt.Errorf("hard link to %q, which the layer does not hold", h.Linkname)
		}
		return os.Link(src, target) // link(2) never follows a symlink source
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		return nil
	default:
		return nil // pax headers are consumed by archive/tar; others carry nothing to write
	}
	if err := lchown(target, h); err != nil {
		return err
	}
	return os.Chmod(target, perm) // after chown, which clears set-id bits
}

// lchown gives an entry its owner; only root can, and a provider runs as
// root (runsc needs it), so elsewhere (a test's unpack) files stay the
// caller's.
func lchown(target string, h *tar.Header) error {
	if os.Geteuid() != 0 {
		return nil
	}
	return os.Lchown(target, h.Uid, h.Gid)
}
