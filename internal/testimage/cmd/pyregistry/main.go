// Command pyregistry serves, on a loopback port, an image of two layers —
// a static busybox and the host's python3 — and prints its reference
// pinned by digest on its first line; it serves until its standard input
// closes. The Python SDK's tests run a pool of that image.
//
//	pyregistry [-busybox /bin/busybox]
package main

import (
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sandboxwich/sandboxwich/internal/testimage"
)

func main() {
	busybox := flag.String("busybox", "/bin/busybox", "a static busybox (scripts/install-busybox.sh)")
	flag.Parse()
	if err := run(*busybox); err != nil {
		fmt.Fprintln(os.Stderr, "pyregistry:", err)
		os.Exit(1)
	}
}

func run(busybox string) error {
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
	_, _ = io.Copy(io.Discard, os.Stdin) // serve until the caller closes stdin
	return nil
}
