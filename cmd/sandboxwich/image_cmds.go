package main

// The images command (CONTRACT §21 "Prefetch"): images prefetch pulls
// images a pool allows into its image cache ahead of the claims, images
// list shows a pool's images.

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/wire"
)

// imagesUsage is the images command's own help.
const imagesUsage = `Usage:
  sandboxwich images prefetch --pool POOL [flags] REF…   pull images the pool allows into its image cache (in the background)
  sandboxwich images list --pool POOL [flags]            show the pool's images: cached, queued, pulling or failed
Run ` + "`sandboxwich images prefetch -h`" + ` for the flags.
`

func cliImages(ctx context.Context, e env, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: name a subcommand: prefetch or list", errUsage)
	}
	switch args[0] {
	case "prefetch":
		return cliImagesPrefetch(ctx, e, args[1:])
	case "list":
		return cliImagesList(ctx, e, args[1:])
	case "-h", "-help", "--help", "help":
		_, err := io.WriteString(e.stderr, imagesUsage)
		return err
	}
	return fmt.Errorf("%w: unknown subcommand %q: prefetch or list", errUsage, args[0])
}

func cliImagesPrefetch(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "images prefetch")
	pool := f.fs.String("pool", "", "a pool of the tenant whose provider keeps an image cache (required)")
	if err := f.parse(args, true); err != nil {
		return err
	}
	refs := f.fs.Args()
	if len(refs) == 0 {
		return fmt.Errorf("%w: name at least one image reference pinned by digest (host/repo@sha256:<hex>)", errUsage)
	}
	sts, err := call(ctx, f, func(ctx context.Context, c *client.Client) ([]wire.ImageState, error) {
		return c.Prefetch(ctx, *pool, refs)
	})
	if err != nil {
		return err
	}
	return f.images(*pool, sts)
}

func cliImagesList(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "images list")
	pool := f.fs.String("pool", "", "a pool of the tenant (required)")
	if err := f.parse(args, false); err != nil {
		return err
	}
	sts, err := call(ctx, f, func(ctx context.Context, c *client.Client) ([]wire.ImageState, error) {
		return c.Images(ctx, *pool)
	})
	if err != nil {
		return err
	}
	return f.images(*pool, sts)
}

// images prints a pool's image states: the wire answer with --json, else
// a table ("-" where the wire says null).
func (f *cliFlags) images(pool string, sts []wire.ImageState) error {
	if f.json {
		if sts == nil {
			sts = []wire.ImageState{}
		}
		return cliJSON(f.e.stdout, wire.ImagesResponse{OK: true, Pool: pool, Images: sts})
	}
	tw := tabwriter.NewWriter(f.e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "IMAGE\tSTATE\tBYTES\tCODE")
	for _, st := range sts {
		bytes, code := "-", "-"
		if st.Bytes != nil {
			bytes = strconv.FormatInt(*st.Bytes, 10)
		}
		if st.Code != nil {
			code = *st.Code
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", st.Image, st.State, bytes, code)
	}
	return tw.Flush()
}
