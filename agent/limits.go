package agent

import (
	"fmt"
	"strconv"
	"strings"
)

// Limits of a process's command line and environment (CONTRACT §14). The
// kernel refuses a larger execve with E2BIG: Linux (and gVisor) take at
// most MAX_ARG_STRLEN = 128 KiB per string, its terminating NUL included,
// and ARG_MAX (a quarter of the stack limit, 2 MiB by default) for all of
// them together. The plane checks a request against these same constants
// before it reaches a cell, and the agent again before it starts a
// process, so a request the kernel would refuse is an invalid request,
// never a failed cell.
const (
	// MaxArgBytes is the longest argv string, and the longest env entry
	// written KEY=value, in bytes.
	MaxArgBytes = 128<<10 - 1
	// MaxArgsBytes bounds every argv string and env entry (KEY=value) of
	// one request together, in bytes; it leaves ARG_MAX room for the base
	// environment and the pointers.
	MaxArgsBytes = 1 << 20
)

// CheckArgs refuses, with ErrInvalid, an argv or env beyond MaxArgBytes
// or MaxArgsBytes. Its messages name the argv index, never the content
// or an env key or value.
func CheckArgs(argv []string, env map[string]string) error {
	total := 0
	for i, a := range argv {
		if len(a) > MaxArgBytes {
			return Errorf(CodeInvalid, "argv["+strconv.Itoa(i)+"] is longer than "+strconv.Itoa(MaxArgBytes)+" bytes")
		}
		total += len(a)
	}
	for k, v := range env {
		n := len(k) + 1 + len(v)
		if n > MaxArgBytes {
			return Errorf(CodeInvalid, fmt.Sprintf("an env entry (KEY=value) is longer than %d bytes", MaxArgBytes))
		}
		total += n
	}
	if total > MaxArgsBytes {
		return Errorf(CodeInvalid, fmt.Sprintf("argv and env (KEY=value) together are longer than %d bytes", MaxArgsBytes))
	}
	return nil
}

// NamesDirectory reports whether the path p, as sent, can only name a
// directory: it ends in "/", "/." or "/..". Cleaning would turn it into a
// file's path, so a file write refuses it first (the plane, the agent and
// the fake agent alike).
func NamesDirectory(p string) bool {
	return strings.HasSuffix(p, "/") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..")
}
