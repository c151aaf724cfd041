package cellagent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// The hostile-input findings on files (issue 40): a write lands only when
// all of its content arrived; zero-size pseudo files read to their end;
// sockets and other special files are refused with a typed error; a path
// ending in "/" is refused.

func init() {
	scenarios = append(scenarios,
		scenario{"write_cut_short_keeps_the_old_file", func(e *env) {
			e.activate(time.Minute)
			p := filepath.Join(e.home, "kept")
			if _, err := e.write(p, "", strings.NewReader("old")); err != nil {
				e.t.Fatalf("first write: %v", err)
			}
			for _, cut := range []error{io.ErrUnexpectedEOF, errors.New("the sender went away")} {
				// More than one frame and one upload chunk, then the failure.
				body := io.MultiReader(content(3<<20+5, 9), failing{cut})
				if _, err := e.write(p, "", body); err == nil {
					e.t.Fatalf("a write whose content failed with %v succeeded", cut)
				}
				if b, err := os.ReadFile(p); err != nil || string(b) != "old" {
					e.t.Fatalf("after a write cut short by %v the file holds %d bytes (%v), want the old 3", cut, len(b), err)
				}
			}
			// Over HTTP the client may see the failure before the agent has
			// removed its temporary file.
			e.eventually("only the old file in the home", func() bool { return dirNames(e.t, e.home) == "kept" })
		}},
		scenario{"write_to_a_directory_path_is_refused", func(e *env) {
			e.activate(time.Minute)
			for _, p := range []string{filepath.Join(e.home, "new") + "/", filepath.Join(e.home, "d", "x") + "/."} {
				_, err := e.write(p, "", strings.NewReader("x"))
				wantCode(e.t, "write to "+p, err, agent.ErrInvalid)
			}
			if names := dirNames(e.t, e.home); names != "" {
				e.t.Fatalf("refused writes left %q in the home", names)
			}
		}},
		scenario{"read_pseudo_files_to_their_end", func(e *env) {
			e.activate(time.Minute)
			for _, p := range []string{"/proc/self/status", "/proc/cpuinfo", "/proc/1/cmdline"} {
				fi, err := os.Stat(p)
				if err != nil || fi.Size() != 0 {
					continue // not a zero-size pseudo file here
				}
				want, err := os.ReadFile(p)
				if err != nil || len(want) == 0 {
					continue // unreadable or empty on this host
				}
				got, err := e.read(p, agent.UserRoot)
				if err != nil || len(got) == 0 {
					e.t.Fatalf("read %s: %d bytes, %v; want its content", p, len(got), err)
				}
			}
		}},
		scenario{"read_a_socket_is_refused", func(e *env) {
			e.activate(time.Minute)
			sock := filepath.Join(e.home, "s.sock")
			ln, err := net.Listen("unix", sock)
			if err != nil {
				e.t.Fatal(err)
			}
			defer ln.Close()
			if err := os.Chmod(sock, 0o777); err != nil {
				e.t.Fatal(err)
			}
			_, err = e.read(sock, "")
			wantCode(e.t, "a Unix socket", err, agent.ErrInvalid)
			_, err = e.read(sock, agent.UserRoot)
			wantCode(e.t, "a Unix socket as root", err, agent.ErrInvalid)
			// The agent still serves the lease.
			if _, err := e.write(filepath.Join(e.home, "after"), "", strings.NewReader("x")); err != nil {
				e.t.Fatalf("a write after the refused read: %v", err)
			}
		}},
	)
}

// failing is a reader that fails with err.
type failing struct{ err error }

func (f failing) Read([]byte) (int, error) { return 0, f.err }

// TestWriteNeedsCompletion: over HTTP, content that ends without its end
// frame writes nothing, whether the body ended cleanly (a relay that turned
// an aborted request into a clean end) or was cut short; so does a frame
// out of bounds or a body that goes on after the end frame.
func TestWriteNeedsCompletion(t *testing.T) {
	requireRoot(t)
	a, home := newAgent(t)
	dir, err := os.MkdirTemp("", "sbw-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: agent.NewHandler(a)}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := agent.NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(c.CloseIdleConnections)
	ctx := t.Context()
	if err := c.Activate(ctx, activation(time.Minute)); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(home, "f")
	if _, err := c.WriteFile(ctx, agent.WriteRequest{Fence: testFence, Path: p}, strings.NewReader("old")); err != nil {
		t.Fatal(err)
	}
	hdr, err := json.Marshal(agent.WriteRequest{Fence: testFence, Path: p})
	if err != nil {
		t.Fatal(err)
	}
	hdr = append(hdr, '\n')
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	t.Cleanup(hc.CloseIdleConnections)
	send := func(parts ...[]byte) int {
		t.Helper()
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://cell/v1/files/write", bytes.NewReader(bytes.Join(append([][]byte{hdr}, parts...), nil)))
		if err != nil {
			t.Fatal(err)
		}
		res, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		_, _ = io.Copy(io.Discard, res.Body)
		return res.StatusCode
	}
	frame := func(b string) []byte { return append(binary.BigEndian.AppendUint32(nil, uint32(len(b))), b...) }
	end := frame("")
	holds := func(want string) {
		t.Helper()
		if b, err := os.ReadFile(p); err != nil || string(b) != want {
			t.Errorf("the file holds %q (%v), want %q", b, err, want)
		}
		if names := dirNames(t, home); names != "f" {
			t.Errorf("the home holds %q, want only the file", names)
		}
	}
	for _, tc := range []struct {
		name  string
		parts [][]byte
	}{
		{"raw content, no frames", [][]byte{[]byte("new")}},
		{"a frame and no end frame", [][]byte{frame("new")}},
		{"a frame cut short", [][]byte{frame("new")[:5]}},
		{"a frame longer than the bound", [][]byte{binary.BigEndian.AppendUint32(nil, 1<<20+1), []byte("new")}},
		{"bytes after the end frame", [][]byte{frame("new"), end, []byte("x")}},
	} {
		if st := send(tc.parts...); st != http.StatusUnprocessableEntity {
			t.Errorf("%s: %d, want 422", tc.name, st)
		}
		holds("old")
	}
	// A body cut short: the connection closes in the middle of a chunk.
	conn, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "POST /v1/files/write HTTP/1.1\r\nHost: cell\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s%s", len(hdr)+100, hdr, frame("new"))
	_ = conn.(*net.UnixConn).CloseWrite()
	_, _ = io.Copy(io.Discard, bufio.NewReader(conn))
	conn.Close()
	holds("old")
	// Frames and the end frame write.
	if st := send(frame("ne"), frame("w"), end); st != http.StatusOK {
		t.Errorf("a framed body with its end frame: %d, want 200", st)
	}
	holds("new")
}
