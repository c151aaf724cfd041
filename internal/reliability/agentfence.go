package reliability

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// AgentFenceConfig configures the cell-agent check: `sandboxwich serve`
// with a pool of real gVisor cells, each running the cell agent.
type AgentFenceConfig struct {
	Bin      string
	Clients  int
	Duration time.Duration
}

// AgentFenceReport is what the check observed.
type AgentFenceReport struct {
	Leases, Execs, Files, Refused int
	// Digests are the agent digests the evidence route reported.
	Digests    map[string]int
	Violations []string
}

func (r AgentFenceReport) String() string {
	s := fmt.Sprintf("%d leases, %d execs and %d file operations under their lease, %d operations under a wrong or ended fence refused, "+
		"%d agent digest(s) in the evidence", r.Leases, r.Execs, r.Files, r.Refused, len(r.Digests))
	if n := len(r.Violations); n > 0 {
		s += fmt.Sprintf("; %d VIOLATIONS: %s", n, strings.Join(r.Violations[:min(n, 5)], "; "))
	}
	return s
}

// Passed reports the verdict.
func (r AgentFenceReport) Passed() bool {
	return len(r.Violations) == 0 && r.Leases > 0 && r.Refused > 0 && len(r.Digests) == 1
}

// marker is the file every lease writes in its cell, holding its lease ID.
const marker = "/home/cell/sandboxwich-marker"

// RunAgentFence runs the check. Every client claims a cell, finds it
// sterile (no lease's marker file in it), runs a command and writes and
// reads back its marker through the agent under its lease, then tries
// the previous lease's proof on the new lease and on the old one, and the
// new lease's after its release: each of those must be refused. At the
// end every lease's evidence must name the same agent digest (one binary
// mounted in every cell).
func RunAgentFence(ctx context.Context, env *Env, cfg AgentFenceConfig) (AgentFenceReport, error) {
	rep := AgentFenceReport{Digests: map[string]int{}}
	spec := ServerSpec{Bin: cfg.Bin, Args: []string{"serve"}, DatabaseURL: "sqlite://" + filepath.Join(env.Dir, "agent.sqlite"),
		LogFile: filepath.Join(env.Dir, "server.log"), SweepMillis: 100,
		Pool: PoolSpec{Provider: "gvisor", Target: 2, MaxProvisioning: 2, ReadyTTLSeconds: 300,
			Settings: map[string]string{"state_dir": filepath.Join(env.Dir, "runsc-state"), "bundle_dir": filepath.Join(env.Dir, "runsc-bundles")}}}
	srv, err := env.Start(ctx, spec, "")
	if err != nil {
		return rep, err
	}
	db, err := OpenDB(spec.DatabaseURL)
	if err != nil {
		srv.Kill()
		return rep, err
	}
	defer db.Close()
	g, err := gvisorLister(ctx, db, spec.Pool.Settings)
	if err != nil {
		srv.Kill()
		return rep, err
	}
	defer func() {
		srv.Stop(10 * time.Second)
		cleanupGVisor(g, env.Dir) // a stopped server keeps its cells for the next start
	}()
	cl, err := client.New(srv.URL, client.WithToken(env.TenantToken))
	if err != nil {
		return rep, err
	}
	var (
		mu     sync.Mutex
		leases []client.Claim
	)
	violate := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(rep.Violations) < 50 {
			rep.Violations = append(rep.Violations, fmt.Sprintf(format, args...))
		}
	}
	count := func(p *int) { mu.Lock(); *p++; mu.Unlock() }
	// refused runs op, which must fail with a wire error (the fence
	// refused it), never succeed or fail otherwise.
	refused := func(what string, err error) {
		var ce *client.Error
		switch {
		case err == nil:
			violate("%s succeeded", what)
		case errors.As(err, &ce) && ce.Status < 500:
			count(&rep.Refused)
		default:
			violate("%s: %v (want a refusal)", what, err)
		}
	}
	deadline := time.Now().Add(cfg.Duration)
	var wg sync.WaitGroup
	for i := range cfg.Clients {
		wg.Go(func() {
			var prev *client.Claim
			for n := 0; time.Now().Before(deadline) && ctx.Err() == nil; n++ {
				seconds := uint64(120)
				c, err := cl.Claim(ctx, wire.ClaimRequest{Release: env.Release, LeaseSeconds: &seconds,
					Binding: lease.Binding{OrganizationID: "org-agent", WorkspaceID: "ws", ThreadID: fmt.Sprintf("t-%d-%d", i, n), RunnerSessionID: "s"}})
				if err != nil {
					violate("claim: %v", err)
					return
				}
				if c.Empty() {
					time.Sleep(200 * time.Millisecond)
					continue
				}
				mu.Lock()
				leases = append(leases, c)
				rep.Leases++
				mu.Unlock()
				id, proof := c.Lease.LeaseID, c.Proof()
				// Sterile: no earlier lease's marker.
				if rc, _, err := cl.ReadFile(ctx, id, proof, client.FileRead{Path: marker}); err == nil {
					b, _ := io.ReadAll(rc)
					rc.Close()
					violate("lease %s found a marker in its fresh cell: %q", id, b)
				} else if !errors.Is(err, errcode.ErrFileNotFound) {
					violate("lease %s: read of the absent marker: %v", id, err)
				}
				count(&rep.Files)
				res, err := cl.Run(ctx, id, proof, client.Command{Argv: []string{"sh", "-c", `echo "$LEASE"`}, Env: map[string]string{"LEASE": id.String()}})
				if err != nil || string(res.Stdout) != id.String()+"\n" {
					violate("lease %s: exec: %q, %v", id, res.Stdout, err)
				}
				count(&rep.Execs)
				if _, err := cl.WriteFile(ctx, id, proof, client.FileWrite{Path: marker}, strings.NewReader(id.String())); err != nil {
					violate("lease %s: write its marker: %v", id, err)
				}
				// The positive control of the sterility read: the marker is found now.
				if rc, _, err := cl.ReadFile(ctx, id, proof, client.FileRead{Path: marker}); err != nil {
					violate("lease %s: read its marker back: %v", id, err)
				} else {
					b, _ := io.ReadAll(rc)
					rc.Close()
					if string(b) != id.String() {
						violate("lease %s: its marker reads %q", id, b)
					}
				}
				count(&rep.Files)
				count(&rep.Files)
				if prev != nil {
					_, err := cl.Run(ctx, id, prev.Proof(), client.Command{Argv: []string{"true"}})
					refused(fmt.Sprintf("exec on lease %s with the proof of lease %s", id, prev.Lease.LeaseID), err)
					_, err = cl.Run(ctx, prev.Lease.LeaseID, prev.Proof(), client.Command{Argv: []string{"true"}})
					refused(fmt.Sprintf("exec on the released lease %s", prev.Lease.LeaseID), err)
				}
				if _, err := cl.Release(ctx, id, proof, lease.Destroyed); err != nil {
					violate("lease %s: release: %v", id, err)
				}
				_, err = cl.WriteFile(ctx, id, proof, client.FileWrite{Path: marker}, strings.NewReader("after"))
				refused(fmt.Sprintf("write on lease %s after its release", id), err)
				prev = &c
			}
		})
	}
	wg.Wait()
	for _, c := range leases {
		ev, err := cl.Evidence(ctx, c.Lease.LeaseID)
		if err != nil {
			violate("evidence of lease %s: %v", c.Lease.LeaseID, err)
			continue
		}
		if ev.AgentDigest == nil || *ev.AgentDigest == "" {
			violate("evidence of lease %s names no agent digest", c.Lease.LeaseID)
			continue
		}
		rep.Digests[*ev.AgentDigest]++
	}
	return rep, nil
}
