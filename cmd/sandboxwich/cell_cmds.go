package main

// The client subcommands that reach into a leased cell: exec (output
// streamed as it comes), cp (files to and from the cell), launch and
// launch-status (the lease's resident workload).

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/wire"
)

// cliMaxStdin is the largest stdin exec sends (CONTRACT §6).
const cliMaxStdin = 1 << 20

// cliCellPrefix marks the cell side of cp: cell:/abs/path.
const cliCellPrefix = "cell:"

// cliEnvFlag registers the repeatable --env flag of a command's
// environment.
func cliEnvFlag(e env, fs *flag.FlagSet) map[string]string {
	vars := map[string]string{}
	fs.Func("env", "KEY=VALUE to set in the command's environment, or KEY to pass this process's value (repeatable)", func(v string) error {
		k, val, ok := strings.Cut(v, "=")
		if k == "" {
			return errors.New("want KEY=VALUE or KEY")
		}
		if !ok {
			val = e.getenv(k)
		}
		vars[k] = val
		return nil
	})
	return vars
}

// cliUserFlag registers --user.
func cliUserFlag(fs *flag.FlagSet, what string) *string {
	return cliVar(fs, new(string), "user", what+" as cell (default) or root (root inside the cell)", func(v string) (string, error) {
		if v != wire.UserCell && v != wire.UserRoot {
			return "", errors.New("want cell or root")
		}
		return v, nil
	})
}

// cliCommandExit is the error a workload command returns for a process's
// exit code: nil for 0, the code itself for 1 to 255, else 1.
func cliCommandExit(code int) error {
	switch {
	case code == 0:
		return nil
	case code > 0 && code < 256:
		return exitCode(code)
	}
	return exitCode(1)
}

func cliExec(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "exec")
	pf := cliProofFlags(f.fs)
	stdinFile := f.fs.String("stdin-file", "", "send this file as the command's stdin; - reads this process's stdin (at most 1 MiB)")
	timeoutSeconds := cliUint(f.fs, "timeout-seconds", "command timeout in seconds (server default 60; the lease's expiry, which renew moves, ends it too)")
	cwd := f.fs.String("cwd", "", "absolute working directory in the cell (default: the cell's home)")
	user := cliUserFlag(f.fs, "run the command")
	cmdEnv := cliEnvFlag(e, f.fs)
	f.fs.Lookup("json").Usage = "print the wire JSON answer (base64 output, at the end) instead of streaming the output"
	if err := f.parse(args, true); err != nil {
		return err
	}
	cmd := client.Command{Argv: f.fs.Args(), Cwd: *cwd, User: *user}
	if len(cmd.Argv) == 0 {
		return fmt.Errorf("%w: no command: exec [flags] -- program [args…]", errUsage)
	}
	proof, err := pf.proof()
	if err != nil {
		return err
	}
	if len(cmdEnv) > 0 {
		cmd.Env = cmdEnv
	}
	if *timeoutSeconds != nil {
		cmd.Timeout = time.Duration(**timeoutSeconds) * time.Second
		// Give a long command its time unless --timeout was set explicitly.
		if !f.set("timeout") {
			f.timeout = max(f.timeout, cmd.Timeout+30*time.Second)
		}
	}
	if *stdinFile != "" {
		if cmd.Stdin, err = cliReadStdin(e, *stdinFile); err != nil {
			return err
		}
	}
	if f.json {
		req, err := cmd.Request(proof)
		if err != nil {
			return err
		}
		resp, err := call(ctx, f, func(ctx context.Context, c *client.Client) (wire.ExecResponse, error) {
			return c.Exec(ctx, *pf.leaseID, req)
		})
		if err != nil {
			return err
		}
		if err := cliJSON(e.stdout, resp); err != nil {
			return err
		}
		return cliCommandExit(resp.ExitCode)
	}
	res, err := call(ctx, f, func(ctx context.Context, c *client.Client) (client.ExecResult, error) {
		return c.ExecStream(ctx, *pf.leaseID, proof, cmd, func(o client.Output) error {
			w := e.stdout
			if o.Stream == client.Stderr {
				w = e.stderr
			}
			_, err := w.Write(o.Data)
			return err
		})
	})
	if err != nil {
		return err
	}
	switch {
	case res.TimedOut:
		fmt.Fprintln(e.stderr, "sandboxwich exec: the command timed out and was killed")
	case res.Reason == wire.ReasonKilled:
		fmt.Fprintln(e.stderr, "sandboxwich exec: the lease ended during the command, which was killed")
	}
	switch {
	case res.Truncated && res.MaxOutputBytes > 0:
		fmt.Fprintf(e.stderr, "sandboxwich exec: output truncated by the server at its cap of %d bytes per stream\n", res.MaxOutputBytes)
	case res.Truncated:
		fmt.Fprintln(e.stderr, "sandboxwich exec: output truncated by the server")
	}
	return cliCommandExit(res.ExitCode)
}

// cliReadStdin reads exec's stdin from a file, or from this process's
// stdin for "-".
func cliReadStdin(e env, name string) ([]byte, error) {
	r := e.stdin
	if name != "-" {
		file, err := os.Open(name)
		if err != nil {
			return nil, fmt.Errorf("--stdin-file: %w", err)
		}
		defer file.Close()
		r = file
	}
	data, err := io.ReadAll(io.LimitReader(r, cliMaxStdin+1))
	switch {
	case err != nil:
		return nil, fmt.Errorf("--stdin-file: %w", err)
	case len(data) > cliMaxStdin:
		return nil, errors.New("--stdin-file: stdin is larger than 1 MiB (copy larger input with cp)")
	}
	return data, nil
}

// cpFile is cp's output: the file as written, wherever that is.
type cpFile = wire.FileWriteResponse

func cliCp(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "cp")
	pf := cliProofFlags(f.fs)
	mode := cliVar(f.fs, new(fs.FileMode), "mode", "permission bits of the file written, in octal (default: the local file's, 0644 from stdin or from the cell)",
		func(v string) (fs.FileMode, error) {
			n, err := strconv.ParseUint(v, 8, 32)
			if err != nil || n == 0 || n > 0o777 {
				return 0, errors.New("want octal permission bits, 0001 to 0777")
			}
			return fs.FileMode(n), nil
		})
	user := cliUserFlag(f.fs, "read or write the cell's file")
	maxBytes := f.fs.Int64("max-bytes", 0, "refuse to copy a file of the cell larger than this (default: the server's bound, 256 MiB)")
	if err := f.parse(args, true); err != nil {
		return err
	}
	if f.fs.NArg() != 2 {
		return fmt.Errorf("%w: want two paths: cp [flags] LOCAL cell:/abs/path, or cp [flags] cell:/abs/path LOCAL", errUsage)
	}
	src, dst := f.fs.Arg(0), f.fs.Arg(1)
	remoteSrc, remoteDst := strings.HasPrefix(src, cliCellPrefix), strings.HasPrefix(dst, cliCellPrefix)
	if remoteSrc == remoteDst {
		return fmt.Errorf("%w: exactly one of the two paths must be in the cell (cell:/abs/path)", errUsage)
	}
	if *maxBytes < 0 {
		return fmt.Errorf("%w: --max-bytes must not be negative", errUsage)
	}
	proof, err := pf.proof()
	if err != nil {
		return err
	}
	var out cpFile
	if remoteDst {
		out, err = cliUpload(ctx, f, pf, proof, src, strings.TrimPrefix(dst, cliCellPrefix), *mode, *user)
	} else {
		if dst == "-" && f.json {
			return fmt.Errorf("%w: --json cannot share stdout with the file's bytes (LOCAL is -)", errUsage)
		}
		out, err = cliDownload(ctx, f, pf, proof, strings.TrimPrefix(src, cliCellPrefix), dst, *mode, *user, *maxBytes)
	}
	if err != nil || (dst == "-" && !remoteDst) {
		return err
	}
	out.OK = true
	return f.output(out, []string{"path", out.Path, "size", strconv.FormatInt(out.Size, 10), "sha256", out.SHA256})
}

// cliUpload copies local (- for stdin) to the cell's path remote; a
// remote path ending in / names a directory, where the file keeps its
// local name. It checks the SHA-256 the cell reports against the bytes
// sent.
func cliUpload(ctx context.Context, f *cliFlags, pf *proofFlags, proof wire.LeaseProof, local, remote string, mode fs.FileMode, user string) (cpFile, error) {
	var src io.Reader = f.e.stdin
	if local != "-" {
		file, err := os.Open(local)
		if err != nil {
			return cpFile{}, err
		}
		defer file.Close()
		st, err := file.Stat()
		if err != nil {
			return cpFile{}, err
		}
		if st.IsDir() {
			return cpFile{}, fmt.Errorf("%s is a directory; cp copies one file", local)
		}
		if mode == 0 {
			mode = st.Mode().Perm()
		}
		src = file
	}
	if strings.HasSuffix(remote, "/") {
		if local == "-" {
			return cpFile{}, fmt.Errorf("%w: copying stdin needs a file name in the cell, not the directory %s", errUsage, remote)
		}
		remote += filepath.Base(local)
	}
	if !path.IsAbs(remote) {
		return cpFile{}, fmt.Errorf("%w: the path in the cell must be absolute: %s%s", errUsage, cliCellPrefix, remote)
	}
	sum := sha256.New()
	out, err := call(ctx, f, func(ctx context.Context, c *client.Client) (cpFile, error) {
		return c.WriteFile(ctx, *pf.leaseID, proof, client.FileWrite{Path: remote, Mode: mode, User: user}, io.TeeReader(src, sum))
	})
	if err != nil {
		return out, err
	}
	if sent := hex.EncodeToString(sum.Sum(nil)); out.SHA256 != sent {
		return out, fmt.Errorf("the cell wrote %s with SHA-256 %s, but the bytes sent have %s", out.Path, out.SHA256, sent)
	}
	return out, nil
}

// cliDownload copies the cell's path remote to local (- for stdout; an
// existing directory receives the file under its name in the cell). A
// local file appears whole or not at all: the bytes go to a temporary
// file beside it, renamed once complete.
func cliDownload(ctx context.Context, f *cliFlags, pf *proofFlags, proof wire.LeaseProof, remote, local string, mode fs.FileMode, user string, maxBytes int64) (cpFile, error) {
	if !path.IsAbs(remote) {
		return cpFile{}, fmt.Errorf("%w: the path in the cell must be absolute: %s%s", errUsage, cliCellPrefix, remote)
	}
	if st, err := os.Stat(local); err == nil && st.IsDir() {
		local = filepath.Join(local, path.Base(remote))
	}
	if mode == 0 {
		mode = 0o644
	}
	return call(ctx, f, func(ctx context.Context, c *client.Client) (cpFile, error) {
		body, size, err := c.ReadFile(ctx, *pf.leaseID, proof, client.FileRead{Path: remote, MaxBytes: maxBytes, User: user})
		if err != nil {
			return cpFile{}, err
		}
		defer body.Close()
		sum := sha256.New()
		if local == "-" {
			_, err := io.Copy(io.MultiWriter(f.e.stdout, sum), body)
			return cpFile{Path: local, Size: size, SHA256: hex.EncodeToString(sum.Sum(nil))}, err
		}
		tmp, err := os.CreateTemp(filepath.Dir(local), ".sandboxwich-cp-*")
		if err != nil {
			return cpFile{}, err
		}
		defer os.Remove(tmp.Name()) // a no-op once renamed
		_, err = io.Copy(io.MultiWriter(tmp, sum), body)
		if err == nil {
			err = tmp.Chmod(mode)
		}
		if err == nil {
			err = tmp.Sync()
		}
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), local)
		}
		if err != nil {
			return cpFile{}, fmt.Errorf("copying %s%s to %s: %w", cliCellPrefix, remote, local, err)
		}
		return cpFile{Path: local, Size: size, SHA256: hex.EncodeToString(sum.Sum(nil))}, nil
	})
}

func cliLaunchKV(l wire.Launch) []string {
	kv := []string{"phase", l.Phase}
	for _, f := range []struct {
		name string
		v    *int
	}{{"pid", l.PID}, {"exit_code", l.ExitCode}} {
		s := "null"
		if f.v != nil {
			s = strconv.Itoa(*f.v)
		}
		kv = append(kv, f.name, s)
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"signal", l.Signal}, {"reason", l.Reason}} {
		s := "null"
		if f.v != nil {
			s = *f.v
		}
		kv = append(kv, f.name, s)
	}
	return kv
}

// cliLaunchFlags are the flags of launch and launch-status: --wait and
// --poll.
type cliLaunchFlags struct {
	wait *bool
	poll *time.Duration
}

func newCLILaunchFlags(fs *flag.FlagSet) cliLaunchFlags {
	return cliLaunchFlags{
		wait: fs.Bool("wait", false, "wait until the workload is terminal (within --timeout) and exit with its status"),
		poll: fs.Duration("poll", client.DefaultPoll, "status polling interval of --wait"),
	}
}

// cliLaunchOutput is where a launched workload's stdout and stderr go in
// the cell (CONTRACT §14).
var cliLaunchOutput = [2]string{"/home/cell/.launch/stdout", "/home/cell/.launch/stderr"}

// launchOutput names how to read a launched workload's output: the proof
// of its lease and the user it ran as.
type launchOutput struct {
	proof wire.LeaseProof
	user  string
}

// finish waits for the launch when asked, prints its status, and returns
// the workload's exit once it is terminal. With out (launch --wait, not
// --json), the terminal workload's stdout and stderr are copied to this
// process's, before its status.
func (lf cliLaunchFlags) finish(ctx context.Context, f *cliFlags, c *client.Client, leaseID uuid.UUID, st wire.Launch, out *launchOutput) error {
	if *lf.wait {
		var err error
		if st, err = c.WaitLaunch(ctx, leaseID, *lf.poll); err != nil {
			_ = cliKV(f.e.stderr, cliLaunchKV(st))
			return fmt.Errorf("waiting for the launched workload: %w", err)
		}
		if out != nil && !f.json {
			for i, w := range []io.Writer{f.e.stdout, f.e.stderr} {
				if err := copyCellFile(ctx, c, leaseID, out.proof, cliLaunchOutput[i], out.user, w); err != nil {
					fmt.Fprintf(f.e.stderr, "sandboxwich launch: the workload's output %s: %v\n", cliLaunchOutput[i], err)
				}
			}
		}
	}
	if err := f.output(wire.LaunchResponse{OK: true, Launch: st}, cliLaunchKV(st)); err != nil {
		return err
	}
	if !*lf.wait || st.ExitCode == nil {
		return nil
	}
	return cliCommandExit(*st.ExitCode)
}

func cliLaunch(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "launch")
	pf := cliProofFlags(f.fs)
	cwd := f.fs.String("cwd", "", "absolute working directory in the cell (default: the cell's home)")
	user := cliUserFlag(f.fs, "run the workload")
	vars := cliEnvFlag(e, f.fs)
	lf := newCLILaunchFlags(f.fs)
	if err := f.parse(args, true); err != nil {
		return err
	}
	spec := client.LaunchSpec{Argv: f.fs.Args(), Cwd: *cwd, User: *user}
	if len(spec.Argv) == 0 {
		return fmt.Errorf("%w: no workload: launch [flags] -- program [args…]", errUsage)
	}
	if len(vars) > 0 {
		spec.Env = vars
	}
	proof, err := pf.proof()
	if err != nil {
		return err
	}
	if *lf.wait && !f.set("timeout") {
		f.timeout = 0 // the lease's expiry ends the workload
	}
	_, err = call(ctx, f, func(ctx context.Context, c *client.Client) (struct{}, error) {
		st, err := c.Launch(ctx, *pf.leaseID, proof, spec)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, lf.finish(ctx, f, c, *pf.leaseID, st, &launchOutput{proof: proof, user: *user})
	})
	return err
}

// copyCellFile copies the file at path in a leased cell to w.
func copyCellFile(ctx context.Context, c *client.Client, leaseID uuid.UUID, proof wire.LeaseProof, path, user string, w io.Writer) error {
	body, _, err := c.ReadFile(ctx, leaseID, proof, client.FileRead{Path: path, User: user})
	if err != nil {
		return err
	}
	defer body.Close()
	_, err = io.Copy(w, body)
	return err
}

func cliLaunchStatus(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "launch-status")
	leaseID := cliUUID(f.fs, "lease-id", "lease ID (required)")
	lf := newCLILaunchFlags(f.fs)
	if err := f.parse(args, false); err != nil {
		return err
	}
	if *lf.wait && !f.set("timeout") {
		f.timeout = 0
	}
	_, err := call(ctx, f, func(ctx context.Context, c *client.Client) (struct{}, error) {
		st, err := c.LaunchStatus(ctx, *leaseID)
		if err != nil {
			return struct{}{}, err
		}
		return struct{}{}, lf.finish(ctx, f, c, *leaseID, st, nil)
	})
	return err
}
