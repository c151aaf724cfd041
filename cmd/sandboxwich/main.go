// Command sandboxwich is the reference server and command-line client of
// Sandboxwich, the sterile-cell control plane.
//
//	sandboxwich serve      run the server (configuration: flags > env > config file)
//	sandboxwich migrate    apply database migrations and exit
//	sandboxwich claim …    client commands against a running server
//
// Run `sandboxwich help` for every command. Exit status: 0 success, 1 a
// failure, 2 a usage error, 3 a claim that leased nothing; exec and
// supervise (and launch and launch-status with --wait) exit with the
// command's status and use 125 for their own failures, as docker run does. With --json a failure is
// {"ok":false,"code","message"} on stdout.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/wire"
)

// env is what a command may touch: its streams and the environment. Commands
// never read os.Args, os.Getenv or os.Stdout directly, so tests can run them.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// environ lists the environment as KEY=value; nil means empty.
	environ func() []string
	// inv, when set, is told of the command's flags by newFlags.
	inv *invocation
}

// invocation is what run learns of a command's flags while it runs: their
// usage, --json, and whether parsing them failed.
type invocation struct {
	fs       *flag.FlagSet
	badFlags bool
}

type command struct {
	name, summary string
	run           func(ctx context.Context, e env, args []string) error
	// workload marks a command that runs one: it exits with the workload's
	// status and with exitOwnFailure for its own failures.
	workload bool
}

// exitOwnFailure is the status of a workload command that failed itself.
const exitOwnFailure = 125

// commands lists every subcommand in help order: the server's, then the
// client's in the order a lease goes through them.
var commands = []command{
	{name: "serve", summary: "run the server", run: serve},
	{name: "migrate", summary: "apply database migrations and exit", run: migrate},
	{name: "dev", summary: "run a local server with zero configuration (SQLite, generated key and tokens, a gVisor pool)", run: dev},
	{name: "sign-release", summary: "operator: print the signature of a release under the signing key", run: signRelease},
	{name: "bench", summary: "measure the claim path against the database's own limit (ratios)", run: runBench},
	{name: "inventory", summary: "show the tenant's ready cells by release and the longest lease a claim gets", run: cliInventory},
	{name: "images", summary: "images prefetch --pool P REF…: pull images an image class allows into its cache ahead of the claims; images list --pool P: its images", run: cliImages},
	{name: "claim", summary: "claim a sterile cell (attestation goes to a new 0600 file)", run: cliClaim},
	{name: "validate", summary: "check a lease attestation against the live lease", run: cliValidate},
	{name: "exec", summary: "run a command in a leased cell, its output streamed as it comes: exec [flags] -- argv…", run: cliExec, workload: true},
	{name: "cp", summary: "copy a file into or out of a leased cell: cp [flags] LOCAL cell:/abs/path, or cell:/abs/path LOCAL (- is stdin/stdout)", run: cliCp},
	{name: "launch", summary: "start the lease's resident workload (optionally --wait for its exit): launch [flags] -- argv…", run: cliLaunch, workload: true},
	{name: "launch-status", summary: "show the lease's launched workload (optionally --wait for its exit)", run: cliLaunchStatus, workload: true},
	{name: "supervise", summary: "the control sidecar: validate the lease, launch its workload, exit with its status: supervise --attestation-file FILE|- --token-file FILE [flags] -- argv…", run: cliSupervise, workload: true},
	{name: "lease", summary: "show the status of a lease", run: cliLease},
	{name: "leases", summary: "list the tenant's leases, newest first (filters, --live, --all)", run: cliLeases},
	{name: "evidence", summary: "show what the server read back from a lease's cell (runtime class, agent digest)", run: cliEvidence},
	{name: "renew", summary: "extend a live lease: renew --lease-seconds N and the lease fence flags; prints the new expiry", run: cliRenew},
	{name: "release", summary: "release a leased pool cell (optionally --wait for proven deletion)", run: cliRelease},
	{name: "revoke", summary: "end a live lease without its attestation (a harness that lost it)", run: cliRevoke},
	{name: "events", summary: "show the tenant's lifecycle events (member events with the operator token); --follow streams them", run: cliEvents},
	{name: "pools", summary: "list pools and their members (operator)", run: cliPools},
	{name: "prepare", summary: "worker: register a prepared ready cell", run: cliPrepare},
	{name: "cell", summary: "worker: show one of the worker's cells", run: cliCell},
	{name: "retire", summary: "worker: quarantine a ready cell", run: cliRetire},
	{name: "destroy", summary: "worker: end a leased cell after tearing it down", run: cliDestroy},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, environ: os.Environ}, os.Args[1:])
	stop()
	os.Exit(code)
}

// errUsage marks an error whose message is a usage problem (exit status 2).
var errUsage = errors.New("usage")

func run(ctx context.Context, e env, args []string) int {
	if len(args) == 0 {
		usage(e.stderr)
		return 2
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 {
			return run(ctx, e, []string{args[1], "-h"})
		}
		usage(e.stdout)
		return 0
	case "version", "-version", "--version":
		bi, _ := debug.ReadBuildInfo()
		fmt.Fprintln(e.stdout, versionLine(bi))
		return 0
	}
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == args[0] })
	if i < 0 {
		fmt.Fprintf(e.stderr, "sandboxwich: unknown command %q (run `sandboxwich help`)\n", args[0])
		return 2
	}
	e.inv = &invocation{}
	return commands[i].exit(e, commands[i].run(ctx, e, args[1:]))
}

// exit reports err, the outcome of c, and returns the exit status.
func (c command) exit(e env, err error) int {
	inv := e.inv
	if errors.Is(err, flag.ErrHelp) && inv.fs != nil {
		inv.fs.SetOutput(e.stderr)
		fmt.Fprintf(e.stderr, "Usage of sandboxwich %s:\n", c.name)
		inv.fs.PrintDefaults()
		return 0
	}
	if ec, ok := errors.AsType[exitCode](err); ok {
		return int(ec) // the command already reported itself
	}
	if err == nil {
		return 0
	}
	code, status, msg := "cli_failure", 1, err.Error()
	if apiErr, ok := errors.AsType[*client.Error](err); ok {
		code = string(apiErr.Code)
	}
	if inv.badFlags || errors.Is(err, errUsage) {
		code, status = "usage", 2
		msg += fmt.Sprintf(" (run `sandboxwich %s -h`)", c.name)
	}
	if c.workload {
		status = exitOwnFailure
	}
	if inv.json() {
		_ = cliJSON(e.stdout, wire.ErrorResponse{OK: false, Code: code, Message: msg})
	} else {
		fmt.Fprintf(e.stderr, "sandboxwich %s: %s\n", c.name, msg)
	}
	return status
}

// json reports whether the command was given --json, even after a flag
// that failed to parse.
func (inv *invocation) json() bool {
	if inv.fs == nil || inv.fs.Lookup("json") == nil {
		return false
	}
	if v, ok := inv.fs.Lookup("json").Value.(flag.Getter).Get().(bool); ok && v {
		return true
	}
	if !inv.badFlags {
		return false
	}
	for _, a := range inv.fs.Args() {
		switch a {
		case "--":
			return false
		case "-json", "--json", "-json=true", "--json=true":
			return true
		}
	}
	return false
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "sandboxwich: control plane for sterile cells (single-use sandboxes for agent evaluation)")
	fmt.Fprintln(w, "\nUsage: sandboxwich <command> [flags]\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-14s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `sandboxwich help <command>` for a command's flags, `sandboxwich --version` for the build.")
}

// versionLine names the build: the module version and, when the binary was
// built from a checkout, its VCS revision.
func versionLine(bi *debug.BuildInfo) string {
	if bi == nil {
		return "sandboxwich (unknown version)"
	}
	s := "sandboxwich " + bi.Main.Version
	for _, set := range bi.Settings {
		switch {
		case set.Key == "vcs.revision":
			s += " revision " + set.Value
		case set.Key == "vcs.modified" && set.Value == "true":
			s += " (modified)"
		}
	}
	return strings.TrimSpace(s)
}

// newFlags returns a flag set that reports errors instead of exiting:
// run prints them, and the flags for -h.
func newFlags(e env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("sandboxwich "+name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	if inv := e.inv; inv != nil {
		inv.fs = fs
		fs.Usage = func() { inv.badFlags = true }
	}
	return fs
}
