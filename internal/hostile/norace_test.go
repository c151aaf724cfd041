//go:build !race

package hostile

const raceBuild = false
