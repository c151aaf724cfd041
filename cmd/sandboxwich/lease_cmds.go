package main

// The tenant commands that need no attestation: inventory (before a run),
// leases (list them), evidence (what the plane read back from a lease's
// cell) and revoke (end a lease whose attestation was lost).

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

func cliLeases(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "leases")
	var q client.LeaseQuery
	f.fs.StringVar(&q.Binding.OrganizationID, "org", "", "only leases of this organization_id")
	f.fs.StringVar(&q.Binding.WorkspaceID, "workspace", "", "only leases of this workspace_id")
	f.fs.StringVar(&q.Binding.ThreadID, "thread", "", "only leases of this thread_id")
	f.fs.StringVar(&q.Binding.RunnerSessionID, "session", "", "only leases of this runner_session_id")
	f.fs.Func("live", "true: only live leases (leased, not expired); false: only the others", func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return errors.New("must be true or false")
		}
		q.Live = &b
		return nil
	})
	f.fs.IntVar(&q.Limit, "limit", 0, "leases per page, 1 to 1000 (server default 100)")
	f.fs.StringVar(&q.Cursor, "cursor", "", "start after this next_cursor of an earlier page")
	all := f.fs.Bool("all", false, "follow next_cursor through every page (--json then prints them as one page)")
	if err := f.parse(args, false); err != nil {
		return err
	}
	page, err := call(ctx, f, func(ctx context.Context, c *client.Client) (client.LeasePage, error) {
		if !*all {
			return c.ListLeases(ctx, q)
		}
		var out client.LeasePage
		for l, err := range c.Leases(ctx, q) {
			if err != nil {
				return out, err
			}
			out.Leases = append(out.Leases, l)
		}
		return out, nil
	})
	if err != nil {
		return err
	}
	if f.json {
		resp := wire.LeasesResponse{OK: true, Leases: page.Leases}
		if resp.Leases == nil {
			resp.Leases = []wire.LeaseSummary{}
		}
		if page.NextCursor != "" {
			resp.NextCursor = &page.NextCursor
		}
		return cliJSON(e.stdout, resp)
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "LEASE_ID\tCELL_ID\tSTATE\tPROVIDER_ABSENT\tEXPIRES_AT\tSESSION\tTHREAD")
	for _, l := range page.Leases {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%t\t%s\t%s\t%s\n", l.LeaseID, l.CellID, l.State, l.ProviderAbsent,
			cliTime(l.ExpiresAt), l.RunnerSessionID, l.ThreadID)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.NextCursor != "" {
		fmt.Fprintf(e.stderr, "sandboxwich leases: more leases: --cursor %s (or --all)\n", page.NextCursor)
	}
	return nil
}

func cliRevoke(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "revoke")
	leaseID := cliUUID(f.fs, "lease-id", "lease ID (required)")
	d := lease.Quarantined
	cliVar(f.fs, &d, "disposition", "the stop a pool cell records: quarantined (default) or destroyed; "+
		"an external worker's cell is always quarantined", func(v string) (lease.Disposition, error) {
		if !lease.ValidDisposition(lease.Disposition(v)) {
			return "", errors.New("must be destroyed or quarantined")
		}
		return lease.Disposition(v), nil
	})
	if err := f.parse(args, false); err != nil {
		return err
	}
	st, err := call(ctx, f, func(ctx context.Context, c *client.Client) (wire.LeaseStatus, error) {
		return c.Revoke(ctx, *leaseID, d)
	})
	if err != nil {
		return err
	}
	return f.output(wire.StatusResponse{OK: true, Status: st}, cliStatusKV(st))
}

func cliInventory(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "inventory")
	if err := f.parse(args, false); err != nil {
		return err
	}
	inv, err := call(ctx, f, func(ctx context.Context, c *client.Client) ([]wire.InventoryEntry, error) { return c.Inventory(ctx) })
	if err != nil {
		return err
	}
	if f.json {
		if inv == nil {
			inv = []wire.InventoryEntry{}
		}
		return cliJSON(e.stdout, wire.InventoryResponse{OK: true, Inventory: inv})
	}
	// An image class's release adds the images it allows and how many of
	// them are cached ("-" for a release without one).
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "RELEASE_SET_ID\tRUNTIME_CLASS\tPOLICY_DIGEST\tREADY\tMAX_LEASE_SECONDS\tIMAGES\tCACHED")
	for _, i := range inv {
		images, cached := "-", "-"
		if len(i.Images) > 0 {
			images = strings.Join(i.Images, ",")
		}
		if i.Cached != nil {
			cached = strconv.Itoa(*i.Cached)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\n", i.ReleaseSetID, i.RuntimeClass, i.PolicyDigest, i.Ready, i.MaxLeaseSeconds,
			images, cached)
	}
	return tw.Flush()
}

func cliEvidence(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "evidence")
	leaseID := cliUUID(f.fs, "lease-id", "lease ID (required)")
	if err := f.parse(args, false); err != nil {
		return err
	}
	ev, err := call(ctx, f, func(ctx context.Context, c *client.Client) (wire.Evidence, error) { return c.Evidence(ctx, *leaseID) })
	if err != nil {
		return err
	}
	str := func(p *string) string {
		if p == nil {
			return "null"
		}
		return *p
	}
	at := func(t *wire.Time) string {
		if t == nil {
			return "null"
		}
		return attest.WireTime(t.Time)
	}
	class := "null"
	if ev.RuntimeClass != nil {
		class = string(*ev.RuntimeClass)
	}
	return f.output(wire.EvidenceResponse{OK: true, Evidence: ev}, []string{
		"cell_id", ev.CellID.String(),
		"pool", ev.Pool,
		"provider", str(ev.Provider),
		"provider_mode", str(ev.ProviderMode),
		"runtime_class", class,
		"image_digest", str(ev.ImageDigest),
		"agent_digest", str(ev.AgentDigest),
		"admitted_at", at(ev.AdmittedAt),
		"last_verified_at", at(ev.LastVerifiedAt),
	})
}
