// Command sandboxwich is the reference server and command-line client of
// Sandboxwich, the sterile-cell control plane.
//
//	sandboxwich serve      run the server (configuration: flags > env > config file)
//	sandboxwich migrate    apply database migrations and exit
//	sandboxwich claim …    client commands against a running server
//
// Run `sandboxwich help` for every command.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"syscall"
)

// env is what a command may touch: its streams and the environment. Commands
// never read os.Args, os.Getenv or os.Stdout directly, so tests can run them.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// environ lists the environment as KEY=value; nil means empty.
	environ func() []string
}

type command struct {
	name, summary string
	run           func(ctx context.Context, e env, args []string) error
}

// commands lists every subcommand in help order.
var commands []command

func register(c command) { commands = append(commands, c) }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, env{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv, environ: os.Environ}, os.Args[1:])
	stop()
	os.Exit(code)
}

// errUsage marks an error whose message is a usage problem (exit status 2).
var errUsage = errors.New("usage")

func run(ctx context.Context, e env, args []string) int {
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(e.stdout)
		if len(args) == 0 {
			return 2
		}
		return 0
	}
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == args[0] })
	if i < 0 {
		fmt.Fprintf(e.stderr, "sandboxwich: unknown command %q (run `sandboxwich help`)\n", args[0])
		return 2
	}
	err := commands[i].run(ctx, e, args[1:])
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, new(exitCode)):
		var ec exitCode
		errors.As(err, &ec)
		return int(ec) // the command already reported itself
	case errors.Is(err, errUsage):
		fmt.Fprintf(e.stderr, "sandboxwich %s: %v\n", args[0], err)
		return 2
	}
	fmt.Fprintf(e.stderr, "sandboxwich %s: %v\n", args[0], err)
	return 1
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "sandboxwich: control plane for sterile cells (single-use sandboxes for agent evaluation)")
	fmt.Fprintln(w, "\nUsage: sandboxwich <command> [flags]\n\nCommands:")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w, "\nRun `sandboxwich <command> -h` for a command's flags.")
}

// newFlags returns a flag set that reports errors instead of exiting.
func newFlags(e env, name string) *flag.FlagSet {
	fs := flag.NewFlagSet("sandboxwich "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	return fs
}
