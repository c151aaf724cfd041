package agent

import (
	"bytes"
	"context"
	"io"
	"os"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	HelperMain()
	os.Exit(m.Run())
}

func TestSmoke(t *testing.T) {
	home, _ := os.MkdirTemp("", "sbw-home-")
	os.Chmod(home, 0o755)
	os.Chown(home, 1000, 1000)
	defer os.RemoveAll(home)
	a, err := New(Config{CellID: "c1", Digest: "sha256:x", Home: home})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	f := Fence{CellID: "c1", LeaseID: "l1", Generation: 1}
	if err := a.Activate(ctx, Activation{Version: 1, Fence: f, ExpiresAt: time.Now().Add(time.Minute), TTLMillis: 60000}); err != nil {
		t.Fatal(err)
	}
	for _, u := range []User{UserCell, UserRoot} {
		res, err := a.Exec(ctx, ExecRequest{Fence: f, Argv: []string{"sh", "-c", "id -u; pwd; echo err >&2; cat; sleep 1000 &"}, User: u, Stdin: []byte("in\n")}, nil)
		t.Logf("%s: %+v %q %q %v", u, res, res.Stdout, res.Stderr, err)
	}
	fi, err := a.WriteFile(ctx, WriteRequest{Fence: f, Path: home + "/a/b/c.txt"}, bytes.NewReader([]byte("hello")))
	t.Logf("%+v %v", fi, err)
	rc, n, err := a.ReadFile(ctx, ReadRequest{Fence: f, Path: home + "/a/b/c.txt"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rc)
	rc.Close()
	t.Logf("%d %q %v", n, b, err)
	_, _, err = a.ReadFile(ctx, ReadRequest{Fence: f, Path: "/root/.bashrc"})
	t.Logf("root read: %v", err)
	st, err := a.Launch(ctx, LaunchRequest{Fence: f, Argv: []string{"sh", "-c", "echo launched; id -u >&2; sleep 1"}})
	t.Logf("launch %+v %v", st, err)
	time.Sleep(1500 * time.Millisecond)
	st, err = a.LaunchStatus(ctx, f)
	t.Logf("launch %+v %v %v", st, *st.ExitCode, err)
	out, _ := os.ReadFile(home + "/.launch/stdout")
	t.Logf("stdout %q", out)
	a.Release(ctx, f)
	ss, err := a.Status(ctx)
	t.Logf("%+v %v", ss, err)
}
