package hostile

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/internal/testenv"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// Scaled-down copies of the timeouts of cmd/sandboxwich/serve.go (10 s,
// 60 s, 6 min, 2 min, 64 KiB there), so that their effect can be shown in
// well under a second each.
const (
	slowReadHeader = 300 * time.Millisecond
	slowRead       = time.Second
	slowWrite      = 3 * time.Second
	slowIdle       = 500 * time.Millisecond
)

// slowServer is the real handler over a real plane and SQLite store, served
// by an http.Server with the fields serve.go sets (see
// TestHostileServerTimeoutsConfigured), at the scaled timeouts.
func slowServer(t *testing.T) (addr string, st store.Store, token, claim string) {
	t.Helper()
	st = testenv.SQLite(t)
	s := newSecrets(t)
	quiet := slog.New(slog.DiscardHandler)
	plane, err := sandboxwich.New(st, s.keys, sandboxwich.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	h, err := httpapi.New(httpapi.Config{Plane: plane, Logger: quiet, Auth: httpapi.Auth{TenantTokens: map[string]string{s.acme: "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: slowReadHeader,
		ReadTimeout:       slowRead,
		WriteTimeout:      slowWrite,
		IdleTimeout:       slowIdle,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(quiet.Handler(), slog.LevelWarn),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	// One ready cell a slow claim could take.
	id, now := uuid.Must(uuid.NewV7()), plane.Now()
	if _, err := st.CreateMember(context.Background(), store.CreateMemberParams{CellID: id, Pool: "p", TenantID: "acme", Now: now}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.AdmitMember(context.Background(), store.AdmitParams{CellID: id, Pool: "p", WorkerID: "pool:p", ProviderCellID: id.String(),
		Release: s.release, ReadyDeadline: now.Add(time.Hour), Now: now}); err != nil {
		t.Fatal(err)
	}
	return ln.Addr().String(), st, s.acme, mustJSON(t, claimBody(s.release, nil))
}

// closedWithin reads conn until the server closes it, and reports how long
// that took (failing after limit) and what the server sent.
func closedWithin(t *testing.T, conn net.Conn, limit time.Duration) (time.Duration, string) {
	t.Helper()
	begin := time.Now()
	_ = conn.SetReadDeadline(begin.Add(limit))
	b, err := io.ReadAll(conn)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the server kept the connection open for %v", limit)
	}
	return time.Since(begin), string(b)
}

func readyCells(t *testing.T, st store.Store) int {
	t.Helper()
	c, err := st.CellCounts(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return c[lease.Ready]
}

// TestHostileSlowClients: with the timeouts serve.go sets, a client that
// trickles its headers is cut off at ReadHeaderTimeout without an answer;
// one that trickles its body is cut off at ReadTimeout, and its claim never
// runs; an idle keep-alive connection is closed at IdleTimeout.
func TestHostileSlowClients(t *testing.T) {
	t.Parallel()
	addr, st, token, slowClaimBody := slowServer(t)

	t.Run("headers", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		go func() {
			for _, c := range []byte("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + strings.Repeat("s", 50)) {
				if _, err := conn.Write([]byte{c}); err != nil {
					return
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
		// The headers never end: only the server's timeout closes the
		// connection, and closedWithin's limit is a hang guard (100× the
		// timeout). Only the lower bound is timed: a loaded machine is
		// slower, never faster.
		d, got := closedWithin(t, conn, 30*time.Second)
		// net/http may say 400 before it closes; the handler (which sets
		// x-request-id on every answer) never runs.
		if got != "" && (!strings.HasPrefix(got, "HTTP/1.1 4") || strings.Contains(strings.ToLower(got), "x-request-id")) {
			t.Fatalf("a slow-header client got an answer from the handler: %q", got)
		}
		if d < slowReadHeader/2 {
			t.Fatalf("closed after %v, before the %v header timeout", d, slowReadHeader)
		}
	})

	t.Run("body", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "POST /v1/sterile-cells/claim HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"+
			"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n", token, len(slowClaimBody))
		go func() {
			for i := 0; i < len(slowClaimBody)-1; i++ { // never the last byte
				if _, err := conn.Write([]byte{slowClaimBody[i]}); err != nil {
					return
				}
				time.Sleep(20 * time.Millisecond)
			}
		}()
		// The body never ends: only the server's read timeout closes the
		// connection; closedWithin's limit is a hang guard (30× it).
		_, got := closedWithin(t, conn, 30*time.Second)
		// The server gives up on the body; whatever it manages to say is
		// an error envelope, never a lease.
		if got != "" {
			r, err := http.ReadResponse(bufio.NewReader(strings.NewReader(got)), nil)
			if err != nil || r.StatusCode != http.StatusBadRequest || !strings.Contains(got, `"code":"invalid_request"`) {
				t.Fatalf("answer to a slow body: %q", got)
			}
		}
		if n := readyCells(t, st); n != 1 {
			t.Fatalf("%d ready cells after a slow claim, want 1 (nothing claimed)", n)
		}
	})

	t.Run("idle", func(t *testing.T) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		br := bufio.NewReader(conn)
		r, err := http.ReadResponse(br, nil)
		if err != nil || r.StatusCode != 200 {
			t.Fatalf("healthz: %v %v", r, err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		// The server closes it (EOF, not this read's deadline, a hang
		// guard of 60× the idle timeout); only the lower bound is timed.
		begin := time.Now()
		_ = conn.SetReadDeadline(begin.Add(30 * time.Second))
		if _, err := br.ReadByte(); err == nil {
			t.Fatal("the server sent bytes on an idle connection")
		} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
			t.Fatal("an idle keep-alive connection stayed open for 30 s")
		}
		if d := time.Since(begin); d < slowIdle/2 {
			t.Fatalf("idle connection closed after %v, before the %v idle timeout", d, slowIdle)
		}
	})
}
