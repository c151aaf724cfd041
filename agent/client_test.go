package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var testFence = Fence{CellID: "cell-1", LeaseID: "lease-1", Generation: 3}

func activation(ttl time.Duration) Activation {
	return Activation{
		Version:   ProtocolVersion,
		Fence:     testFence,
		ExpiresAt: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC),
		TTLMillis: ttl.Milliseconds(),
	}
}

// serveHandler serves h on a Unix socket and returns a Client for it.
func serveHandler(t *testing.T, h http.Handler) *Client {
	t.Helper()
	dir, err := os.MkdirTemp("", "sbw-sock-") // short: a socket path has ≤ 107 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// TestClientDeadSocket: a Client whose agent cannot be reached gets an
// error that is not an answer.
func TestClientDeadSocket(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "dead.sock")
	c := NewClient(func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	})
	ctx := context.Background()
	if _, err := c.Status(ctx); err == nil || IsAnswer(err) {
		t.Fatalf("status of a dead socket: %v", err)
	}
	if err := c.Activate(ctx, activation(time.Minute)); err == nil || IsAnswer(err) {
		t.Fatalf("activate on a dead socket: %v", err)
	}
	if _, err := c.Exec(ctx, ExecRequest{Fence: testFence, Argv: []string{"true"}}, nil); err == nil || IsAnswer(err) {
		t.Fatalf("exec on a dead socket: %v", err)
	}
}

// TestClientBrokenAnswers: an answer cut short, or an agent failure that
// is no decision, is not an *Error.
func TestClientBrokenAnswers(t *testing.T) {
	var mu sync.Mutex
	answer := func(w http.ResponseWriter, r *http.Request) {}
	srv := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		f := answer
		mu.Unlock()
		f(w, r)
	})
	c := serveHandler(t, srv)
	ctx := context.Background()
	set := func(f func(w http.ResponseWriter, r *http.Request)) {
		mu.Lock()
		answer = f
		mu.Unlock()
	}
	// An exec stream that ends without a result.
	set(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		fmt.Fprintln(w, `{"stream":"stdout","data":"YQo="}`)
	})
	var got []Output
	_, err := c.Exec(ctx, ExecRequest{Fence: testFence, Argv: []string{"x"}}, func(o Output) error { got = append(got, o); return nil })
	if err == nil || IsAnswer(err) || len(got) != 1 || string(got[0].Data) != "a\n" {
		t.Fatalf("cut stream: %v %v", err, got)
	}
	// A file read cut short of its Content-Length.
	set(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "10")
		w.WriteHeader(http.StatusOK)
		w.Write([]byte("abc"))
	})
	rc, n, err := c.ReadFile(ctx, ReadRequest{Fence: testFence, Path: "/x"})
	if err != nil || n != 10 {
		t.Fatalf("read: %v %d", err, n)
	}
	if _, err := io.ReadAll(rc); err == nil || IsAnswer(err) {
		t.Fatalf("short read: %v", err)
	}
	rc.Close()
	// An internal failure, and a refusal with an unknown code.
	for _, body := range []string{`{"code":"internal","message":"fork: resource temporarily unavailable"}`, `{"code":"whatever"}`, `not json`} {
		set(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusInternalServerError)
			fmt.Fprint(w, body)
		})
		if _, err := c.Status(ctx); err == nil || IsAnswer(err) {
			t.Fatalf("%s: %v", body, err)
		}
	}
	// A decided refusal is an *Error.
	set(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusGone)
		fmt.Fprint(w, `{"code":"expired","message":"the lease ended"}`)
	})
	if _, err := c.Status(ctx); !errors.Is(err, ErrExpired) {
		t.Fatalf("refusal: %v", err)
	}
}
