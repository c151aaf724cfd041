//go:build !linux

package main

// becomeInit does nothing: only on Linux is the agent a container's init.
func becomeInit() error { return nil }

// releaseFilePages does nothing: the agent's cells run on Linux.
func releaseFilePages() {}
