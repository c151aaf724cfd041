package main

import (
	"fmt"
	"os"
	"syscall"
)

// prSetDumpable is prctl's PR_SET_DUMPABLE.
const prSetDumpable = 4

// becomeInit prepares the agent to be a cell's init (PID 1):
//
//   - its stdio becomes /dev/null: the runtime hands a container's init
//     the stdio of whoever created the container (runsc create's: host
//     files), which a cell process could otherwise reach through
//     /proc/1/fd; the agent's log therefore goes nowhere;
//   - it is not dumpable, so no workload, root included (none holds
//     CAP_SYS_PTRACE), can read its memory, environment or file
//     descriptors through /proc/1 or trace it. (Starting a child as
//     another user would otherwise make it so at a time of the kernel's
//     choosing: the credential change happens in a vfork child that
//     shares the agent's memory.)
func becomeInit() error {
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer null.Close()
	for fd := range 3 {
		if err := syscall.Dup3(int(null.Fd()), fd, 0); err != nil {
			return fmt.Errorf("stdio: %w", err)
		}
	}
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetDumpable, 0, 0); errno != 0 {
		return fmt.Errorf("prctl(PR_SET_DUMPABLE): %w", errno)
	}
	return nil
}
