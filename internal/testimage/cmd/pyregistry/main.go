// Command pyregistry serves, on a loopback port, an image of two layers —
// a static busybox and the host's python3 — and prints its reference
// pinned by digest on its first line; with -images N, N more images
// follow, one reference per line: swe/task-01 … swe/task-N, each that
// image with its own /etc/marker ("task-01\n" …), for an image class
// (CONTRACT §21). It serves until its standard input closes. The Python
// SDK's tests run a pool of the first image, and an image class of the
// others.
//
//	pyregistry [-busybox /bin/busybox] [-images N]
package main

import (
	"archive/tar"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/google/go-containerregistry/pkg/v1/mutate"

	"github.com/sandboxwich/sandboxwich/internal/testimage"
)

func main() {
	busybox := flag.String("busybox", "/bin/busybox", "a static busybox (scripts/install-busybox.sh)")
	images := flag.Int("images", 0, "also serve this many marked images, swe/task-01 …")
	flag.Parse()
	if err := run(*busybox, *images); err != nil {
		fmt.Fprintln(os.Stderr, "pyregistry:", err)
		os.Exit(1)
	}
}

func run(busybox string, images int) error {
	bb, err := testimage.Busybox(busybox)
	if err != nil {
		return err
	}
	py, err := testimage.HostPython()
	if err != nil {
		return err
	}
	img, err := testimage.Image(bb, py)
	if err != nil {
		return err
	}
	reg, err := testimage.Serve()
	if err != nil {
		return err
	}
	defer reg.Close()
	ref, err := reg.Push("python", img)
	if err != nil {
		return err
	}
	fmt.Println(ref)
	for i := 1; i <= images; i++ {
		task := fmt.Sprintf("task-%02d", i)
		marker, err := testimage.Layer(testimage.Entry{Name: "etc/", Type: tar.TypeDir}, testimage.Entry{Name: "etc/marker", Body: task + "\n"})
		if err != nil {
			return err
		}
		img, err := mutate.AppendLayers(img, marker)
		if err != nil {
			return err
		}
		ref, err := reg.Push("swe/"+task, img)
		if err != nil {
			return err
		}
		fmt.Println(ref)
	}
	_, _ = io.Copy(io.Discard, os.Stdin) // serve until the caller closes stdin
	return nil
}
