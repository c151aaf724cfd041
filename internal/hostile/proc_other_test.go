//go:build !linux

package hostile

import "os/exec"

func dieWithTest(*exec.Cmd) {}
