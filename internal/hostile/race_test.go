//go:build race

package hostile

// raceBuild: the test binary runs under the race detector, so the server
// binary is built with -race too (sharing the build cache of the tests).
const raceBuild = true
