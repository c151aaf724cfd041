// Command ptrace tries to attach to the process its argument names and
// prints the outcome: the gVisor tests run it as the cell user against the
// cell agent.
package main

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
)

func main() {
	pid, err := strconv.Atoi(os.Args[1])
	if err != nil {
		fmt.Println("usage: ptrace <pid>")
		os.Exit(2)
	}
	if err := syscall.PtraceAttach(pid); err != nil {
		fmt.Println("attach:", err)
		return
	}
	fmt.Println("attached")
	_ = syscall.PtraceDetach(pid)
}
