package k8stest

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/sandboxwich/sandboxwich/internal/testenv"
)

// TestIPAMNeverSharesAnAddress: the node's address allocator hands each
// of the subnet's 253 Pod addresses to one live holder at a time, refuses
// a 254th holder, reuses only a freed address, and keeps handing out
// addresses in turn. The allocator before it wrapped around to .2 after
// .254 whoever held it.
func TestIPAMNeverSharesAnAddress(t *testing.T) {
	_, err := exec.LookPath("flock")
	testenv.Need(t, "flock(1)", err)
	state := t.TempDir()
	script := filepath.Join(state, "sbwipam")
	if err := os.WriteFile(script, []byte(strings.ReplaceAll(ipamScript, "@STATE@", state)), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (int, error) {
		out, err := exec.Command(script, args...).Output()
		if err != nil {
			return 0, err
		}
		return strconv.Atoi(strings.TrimSpace(string(out)))
	}
	add := func(id string) int {
		t.Helper()
		n, err := run("add", id)
		if err != nil {
			t.Fatalf("add %s: %v", id, err)
		}
		if n < 2 || n > 254 {
			t.Fatalf("add %s: address .%d is outside .2–.254", id, n)
		}
		return n
	}
	del := func(id string) {
		t.Helper()
		if err := exec.Command(script, "del", id).Run(); err != nil {
			t.Fatalf("del %s: %v", id, err)
		}
	}

	// held maps each address handed out and not freed to its holder.
	held := map[int]string{}
	take := func(id string) int {
		t.Helper()
		n := add(id)
		if other, ok := held[n]; ok {
			t.Fatalf("address .%d handed to %s while %s holds it", n, id, other)
		}
		held[n] = id
		return n
	}

	// Two Pods live for the whole test, as a long case's cell does while
	// others come and go.
	take("long-a")
	take("long-b")
	// Many more Pods than the subnet holds come and go around them.
	for i := range 300 {
		id := "short-" + strconv.Itoa(i)
		delete(held, take(id))
		del(id)
	}
	// Fill the subnet: every address once, then none.
	for i := range 251 {
		take("fill-" + strconv.Itoa(i))
	}
	if n, err := run("add", "one-too-many"); err == nil {
		t.Fatalf("a 254th holder got address .%d", n)
	}
	// A freed address is the only one to hand out.
	del(held[100])
	if n := add("after-free"); n != 100 {
		t.Fatalf("with only .100 free, add gave .%d", n)
	}
}
