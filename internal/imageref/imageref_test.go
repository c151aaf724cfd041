package imageref

import (
	"errors"
	"strings"
	"testing"
)

const hex64 = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestParse(t *testing.T) {
	for _, ok := range []string{
		"registry.example/team/cell@sha256:" + hex64,
		"registry.example/team/cell:v1@sha256:" + hex64,
		"127.0.0.1:5000/cell@sha256:" + hex64,
		"index.docker.io/library/busybox@sha256:" + hex64,
	} {
		d, err := Parse(ok)
		if err != nil {
			t.Errorf("Parse(%q): %v", ok, err)
			continue
		}
		if d.DigestStr() != "sha256:"+hex64 {
			t.Errorf("Parse(%q).DigestStr() = %q", ok, d.DigestStr())
		}
	}
	for _, bad := range []string{
		"", " registry.example/cell@sha256:" + hex64,
		"registry.example/cell", "registry.example/cell:latest", // tag only
		"registry.example/cell@sha256:" + hex64[:63],             // short
		"registry.example/cell@sha256:" + strings.ToUpper(hex64), // not lowercase
		"registry.example/cell@sha512:" + hex64 + hex64,          // not SHA-256
		"registry.example/cell@@sha256:" + hex64,
		"Registry.Example/CELL@sha256:" + hex64,
		"registry.example/cell@" + hex64,
	} {
		_, err := Parse(bad)
		var e *Error
		if !errors.As(err, &e) {
			t.Errorf("Parse(%q) = %v, want an *Error", bad, err)
		}
	}
}
