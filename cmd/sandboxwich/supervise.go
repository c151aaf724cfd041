package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// superviseValidated, when set (tests only), runs between the lease's
// validation and the launch: the window in which a lease may be revoked
// or expire.
var superviseValidated func()

// cliSupervise is `sandboxwich supervise`, the credential-bearing control
// sidecar of CONTRACT §13: it runs outside the tenant's RuntimeClass (a
// Pod of its own, or a host process), reads the raw attestation from a
// file no group or other may read, or from stdin, and the tenant token
// from a file; validates the lease; calls launch, so that the plane
// re-verifies the cell's runtime and image and activates its agent —
// a lost answer is retried as the exact same request, which the plane
// answers as a replay and never starts twice; polls the launch status;
// and exits with the workload's exit code (125 for its own failures). The
// attestation stays in this process's memory: it is never in argv, the
// environment, a log line or the cell.
func cliSupervise(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "supervise")
	leaseID := cliUUID(f.fs, "lease-id", "lease ID (required)")
	attFile := f.fs.String("attestation-file", "", "the raw lease attestation: a file only its owner may read (0600 or 0400), or - for stdin (required)")
	generation := f.fs.Uint64("generation", lease.GenerationLeased, "lease generation")
	binding := cliBinding(f.fs)
	cwd := f.fs.String("cwd", "", "absolute working directory in the cell (default: the cell's home)")
	user := cliUserFlag(f.fs, "run the workload")
	vars := cliEnvFlag(e, f.fs)
	poll := f.fs.Duration("poll", client.DefaultPoll, "launch status polling interval")
	if err := f.parse(args, true); err != nil {
		return err
	}
	spec := client.LaunchSpec{Argv: f.fs.Args(), Cwd: *cwd, User: *user}
	if len(spec.Argv) == 0 {
		return fmt.Errorf("%w: no workload: supervise [flags] -- program [args…]", errUsage)
	}
	if len(vars) > 0 {
		spec.Env = vars
	}
	if f.tokenFile == "" {
		return fmt.Errorf("%w: --token-file is required: supervise reads the tenant token from a file, never the environment", errUsage)
	}
	att, err := superviseAttestation(e.stdin, *attFile)
	if err != nil {
		return err
	}
	proof := wire.LeaseProof{LeaseAttestation: att, Generation: *generation, Binding: *binding}
	if !f.set("timeout") {
		f.timeout = 0 // the lease's expiry ends the workload
	}
	_, err = call(ctx, f, func(ctx context.Context, c *client.Client) (struct{}, error) {
		l, err := c.Validate(ctx, *leaseID, proof)
		if err != nil {
			return struct{}{}, fmt.Errorf("validating the lease: %w", err)
		}
		if !time.Now().Before(l.ExpiresAt.Time) {
			return struct{}{}, fmt.Errorf("the lease expired at %s", l.ExpiresAt.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(f.e.stderr, "supervise: lease %s of cell %s valid until %s; launching\n", l.LeaseID, l.CellID, l.ExpiresAt.UTC().Format(time.RFC3339))
		if superviseValidated != nil {
			superviseValidated()
		}
		st, err := c.Launch(ctx, *leaseID, proof, spec)
		if err != nil {
			return struct{}{}, fmt.Errorf("launching: %w", err)
		}
		fmt.Fprintf(f.e.stderr, "supervise: launch %s\n", strings.Join(cliLaunchKV(st), " "))
		if st.Phase != wire.PhaseTerminal {
			if st, err = c.WaitLaunch(ctx, *leaseID, *poll); err != nil {
				return struct{}{}, fmt.Errorf("waiting for the workload: %w", err)
			}
		}
		if err := f.output(wire.LaunchResponse{OK: true, Launch: st}, cliLaunchKV(st)); err != nil {
			return struct{}{}, err
		}
		if st.ExitCode == nil {
			return struct{}{}, errors.New("the launch is terminal without an exit code")
		}
		return struct{}{}, cliCommandExit(*st.ExitCode)
	})
	return err
}

// superviseAttestation reads the attestation from stdin ("-") or from a
// regular file that no group or other may read or write (mode 0600 or
// stricter): a looser file is refused before it is read.
func superviseAttestation(stdin io.Reader, path string) (string, error) {
	var b []byte
	if path == "-" {
		var err error
		if b, err = io.ReadAll(io.LimitReader(stdin, cliMaxSecretFile+1)); err != nil {
			return "", fmt.Errorf("--attestation-file -: reading stdin: %w", err)
		}
	} else {
		fh, err := os.Open(path)
		if err != nil {
			return "", fmt.Errorf("--attestation-file: %w", err)
		}
		defer fh.Close()
		fi, err := fh.Stat()
		if err != nil {
			return "", fmt.Errorf("--attestation-file: %w", err)
		}
		if !fi.Mode().IsRegular() {
			return "", fmt.Errorf("--attestation-file %s is not a regular file", path)
		}
		if fi.Mode().Perm()&0o077 != 0 {
			return "", fmt.Errorf("--attestation-file %s has mode %04o: group or other may access it; chmod 0600 it", path, fi.Mode().Perm())
		}
		if b, err = io.ReadAll(io.LimitReader(fh, cliMaxSecretFile+1)); err != nil {
			return "", fmt.Errorf("--attestation-file: %w", err)
		}
	}
	if len(b) > cliMaxSecretFile {
		return "", fmt.Errorf("--attestation-file %s is larger than %d bytes", path, cliMaxSecretFile)
	}
	att := strings.TrimSpace(string(b))
	if att == "" {
		return "", fmt.Errorf("--attestation-file %s is empty", path)
	}
	return att, nil
}
