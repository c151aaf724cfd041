package client

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

var testProof = wire.LeaseProof{LeaseAttestation: testAttestation, Generation: 2}

// sseAnswer answers with a text/event-stream body.
func sseAnswer(body string) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Request-Id", "req-s")
		_, _ = io.WriteString(w, body)
	}
}

// TestExecStreamParses: output in order, CRLF lines, comments, multi-line
// data and unknown events, then the exit event's result.
func TestExecStreamParses(t *testing.T) {
	f := newFake(t, sseAnswer(": hello\n\n"+
		"event: stdout\ndata: {\"data_base64\":\"b25l\"}\n\n"+
		"event: stderr\r\ndata: {\"data_base64\":\r\ndata: \"dHdv\"}\r\n\r\n"+
		"event: progress\ndata: {}\n\n"+
		"data: {\"data_base64\":\"bm8gZXZlbnQ=\"}\n\n"+
		"event: stdout\ndata:{\"data_base64\":\"dGhyZWU=\"}\n\n"+
		": keep-alive\n\n"+
		"event: exit\ndata: {\"ok\":true,\"exit_code\":137,\"truncated\":true,\"duration_ms\":9,\"timed_out\":true,\"signal\":\"KILL\",\"reason\":\"timed_out\"}\n\n"+
		"event: stdout\ndata: {\"data_base64\":\"aWdub3JlZA==\"}\n\n"))
	var got []string
	res, err := f.client().ExecStream(context.Background(), testLease().LeaseID, testProof,
		Command{Argv: []string{"x"}, Cwd: "/w", User: wire.UserRoot}, func(o Output) error {
			got = append(got, string(o.Stream)+":"+string(o.Data))
			return nil
		})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "stdout:one,stderr:two,stdout:three" {
		t.Errorf("output %q", got)
	}
	want := ExecResult{ExitCode: 137, Truncated: true, TimedOut: true, Signal: "KILL", Reason: wire.ReasonTimedOut, Duration: 9 * time.Millisecond}
	if fmt.Sprint(res) != fmt.Sprint(want) {
		t.Errorf("result %+v, want %+v", res, want)
	}
	r := f.requests()[0]
	var req wire.ExecRequest
	if err := json.Unmarshal(r.Body, &req); err != nil || req.Cwd != "/w" || req.User != "root" || r.Header.Get("Accept") != "text/event-stream" {
		t.Errorf("request %s %v", r.Body, r.Header)
	}
}

// TestExecStreamFailures: an error event is an *Error of its code; a
// stream without exit, a non-stream answer, an error answer and a failing
// callback all fail; nothing is retried.
func TestExecStreamFailures(t *testing.T) {
	ctx := context.Background()
	nop := func(Output) error { return nil }
	run := func(f *fakeServer, out func(Output) error) error {
		_, err := f.client().ExecStream(ctx, testLease().LeaseID, testProof, Command{Argv: []string{"x"}}, out)
		if n := len(f.requests()); n != 1 {
			t.Errorf("%d requests, want 1", n)
		}
		return err
	}
	f := newFake(t, sseAnswer("event: stdout\ndata: {\"data_base64\":\"eA==\"}\n\nevent: error\ndata: {\"code\":\"cell_agent_unverified\",\"message\":\"bad agent\"}\n\n"))
	err := run(f, nop)
	if e, ok := errors.AsType[*Error](err); !ok || e.Code != errcode.CellAgentUnverified || e.Status != 409 || e.Message != "bad agent" ||
		e.RequestID != "req-s" || !errors.Is(err, errcode.ErrCellAgentUnverified) {
		t.Errorf("error event: %#v", err)
	}
	if err := run(newFake(t, sseAnswer("event: stdout\ndata: {\"data_base64\":\"eA==\"}\n\n")), nop); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("stream without exit: %v", err)
	}
	if err := run(newFake(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		writeJSON(w, 200, wire.ExecResponse{ExecExit: wire.ExecExit{OK: true}})
	}), nop); err == nil || !strings.Contains(err.Error(), "not an event stream") {
		t.Errorf("JSON answer: %v", err)
	}
	if err := run(newFake(t, fail(503, errcode.Internal, "")), nop); !errors.Is(err, errcode.ErrInternal) {
		t.Errorf("503: %v", err)
	}
	if err := run(newFake(t, sseAnswer("event: stdout\ndata: {\"data_base64\":\"!\"}\n\n")), nop); err == nil {
		t.Error("bad base64 accepted")
	}
	stop := errors.New("enough")
	if err := run(newFake(t, sseAnswer("event: stdout\ndata: {\"data_base64\":\"eA==\"}\n\nevent: exit\ndata: {}\n\n")),
		func(Output) error { return stop }); !errors.Is(err, stop) {
		t.Errorf("callback error: %v", err)
	}
	if _, err := newFake(t).client().ExecStream(ctx, testLease().LeaseID, testProof, Command{Argv: []string{"x"}, IdempotencyKey: "k"}, nop); err == nil {
		t.Error("ExecStream took an idempotency key")
	}
}

// TestNewCodesMatchSentinels: every code of the agent operations is an
// *Error matching its errcode sentinel, and none of them is retried.
func TestNewCodesMatchSentinels(t *testing.T) {
	for code, status := range map[errcode.Code]int{
		errcode.FileNotFound: 404, errcode.FileAccessDenied: 403, errcode.InsufficientStorage: 507,
		errcode.UserUnsupported: 422, errcode.CellAgentUnverified: 409, errcode.ImageDigestUnverified: 409,
		errcode.PayloadTooLarge: 413, errcode.ExecUnsupported: 501,
	} {
		f := newFake(t, fail(status, code, ""))
		_, _, err := f.client().ReadFile(context.Background(), testLease().LeaseID, testProof, FileRead{Path: "/f"})
		if !errors.Is(err, &errcode.Error{Code: code}) || errcode.CodeOf(err) != code || len(f.requests()) != 1 {
			t.Errorf("%s: %v after %d requests", code, err, len(f.requests()))
		}
	}
	if errcode.ForStatus(507) != errcode.InsufficientStorage || errcode.ForStatus(431) != errcode.RequestHeaderTooLarge {
		t.Error("codeForStatus of 507 or 431")
	}
}

// TestWriteFileStreams: the proof part, then the content as the caller's
// reader yields it — the server has the first part of the content while
// the caller still holds the rest.
func TestWriteFileStreams(t *testing.T) {
	const first = 64 << 10
	received := make(chan struct{})
	var proof wire.FileWriteRequest
	var proofType string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
		mr := multipart.NewReader(r.Body, params["boundary"])
		p, err := mr.NextPart()
		if err != nil || p.FormName() != "proof" {
			t.Errorf("first part %v %v", p, err)
			return
		}
		proofType = p.Header.Get("Content-Type")
		_ = json.NewDecoder(p).Decode(&proof)
		if p, err = mr.NextPart(); err != nil || p.FormName() != "content" {
			t.Errorf("second part %v %v", p, err)
			return
		}
		h := sha256.New()
		n, err := io.CopyN(h, p, first)
		if err != nil {
			t.Error(err)
			return
		}
		close(received)
		m, _ := io.Copy(h, p)
		writeJSON(w, 200, wire.FileWriteResponse{OK: true, Path: proof.Path, Size: n + m, SHA256: hex.EncodeToString(h.Sum(nil))})
	}))
	defer srv.Close()
	c, err := New(srv.URL, WithToken("tok"))
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte("abcdefgh"), (first+4096)/8)
	content := io.MultiReader(bytes.NewReader(data), readerFunc(func([]byte) (int, error) {
		select {
		case <-received:
			return 0, io.EOF
		case <-time.After(20 * time.Second):
			return 0, errors.New("the server never had the first part: the client buffered the content")
		}
	}), strings.NewReader("tail"))
	got, err := c.WriteFile(context.Background(), testLease().LeaseID, testProof, FileWrite{Path: "/d/f", Mode: 0o755, User: wire.UserRoot}, content)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(append(data, "tail"...))
	if got.Size != int64(len(data)+4) || got.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("answer %+v", got)
	}
	if proofType != "application/json" || proof.Path != "/d/f" || proof.Mode != "0755" || proof.User != "root" || proof.LeaseAttestation != testAttestation {
		t.Errorf("proof part (%s) %+v", proofType, proof)
	}
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestWriteFileRefused: a refusal answered before the content was read is
// the server's error, sent once; WriteFile no longer reads content after
// it returns.
func TestWriteFileRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 409, wire.ErrorResponse{Code: "conflict", Message: "fence"})
	}))
	defer srv.Close()
	c, err := New(srv.URL, WithToken("tok"))
	if err != nil {
		t.Fatal(err)
	}
	returned := make(chan struct{})
	late := make(chan struct{}, 1)
	content := readerFunc(func(p []byte) (int, error) {
		select {
		case <-returned:
			late <- struct{}{}
		default:
		}
		clear(p)
		return len(p), nil // endless
	})
	_, err = c.WriteFile(context.Background(), testLease().LeaseID, testProof, FileWrite{Path: "/f"}, content)
	close(returned)
	if !errors.Is(err, errcode.ErrConflict) {
		t.Fatalf("WriteFile = %v, want the server's conflict", err)
	}
	time.Sleep(10 * time.Millisecond)
	select {
	case <-late:
		t.Error("content was read after WriteFile returned")
	default:
	}
	if _, err := c.WriteFile(context.Background(), testLease().LeaseID, testProof, FileWrite{Path: "/f", Mode: 0o4755}, strings.NewReader("")); err == nil {
		t.Error("a setuid mode was sent")
	}
}

// TestReadFileRetriesUntilContent: the request is retried like a read; the
// content then comes as a reader with its size.
func TestReadFileRetriesUntilContent(t *testing.T) {
	f := newFake(t, fail(503, errcode.Internal, ""), drop, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", "5")
		_, _ = io.WriteString(w, "bytes")
	})
	rc, size, err := f.client().ReadFile(context.Background(), testLease().LeaseID, testProof, FileRead{Path: "/f", MaxBytes: 9, User: "root"})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil || string(b) != "bytes" || size != 5 || len(f.requests()) != 3 {
		t.Errorf("ReadFile = %q %d %v after %d requests", b, size, err, len(f.requests()))
	}
	var req wire.FileReadRequest
	if err := json.Unmarshal(f.requests()[2].Body, &req); err != nil || req.MaxBytes == nil || *req.MaxBytes != 9 || req.User != "root" ||
		f.requests()[2].Header.Get("Accept") != "application/octet-stream" {
		t.Errorf("request %s", f.requests()[2].Body)
	}
}

// TestLaunchRetriesAndWaits: Launch resends a lost request byte for byte;
// WaitLaunch polls to the terminal status.
func TestLaunchRetriesAndWaits(t *testing.T) {
	pid, code, reason := 2, 4, "exited"
	running := wire.LaunchResponse{OK: true, Launch: wire.Launch{Phase: "running", PID: &pid}}
	done := wire.LaunchResponse{OK: true, Launch: wire.Launch{Phase: "terminal", PID: &pid, ExitCode: &code, Reason: &reason}}
	f := newFake(t, drop, func(w http.ResponseWriter, _ *http.Request, _ []byte) { writeJSON(w, 200, running) },
		func(w http.ResponseWriter, _ *http.Request, _ []byte) { writeJSON(w, 200, running) },
		fail(502, errcode.Internal, ""),
		func(w http.ResponseWriter, _ *http.Request, _ []byte) { writeJSON(w, 200, done) })
	c := f.client()
	l, err := c.Launch(context.Background(), testLease().LeaseID, testProof, LaunchSpec{Argv: []string{"srv"}, Cwd: "/w", Env: map[string]string{"A": "b"}})
	if err != nil || l.Phase != "running" {
		t.Fatalf("Launch = %+v %v", l, err)
	}
	reqs := f.requests()
	if len(reqs) != 2 || !bytes.Equal(reqs[0].Body, reqs[1].Body) {
		t.Fatalf("%d launch requests; bodies %s / %s", len(reqs), reqs[0].Body, reqs[1].Body)
	}
	l, err = c.WaitLaunch(context.Background(), testLease().LeaseID, time.Millisecond)
	if err != nil || l.Phase != "terminal" || *l.ExitCode != 4 || len(f.requests()) != 5 {
		t.Errorf("WaitLaunch = %+v %v after %d requests", l, err, len(f.requests()))
	}
	f = newFake(t, fail(409, errcode.Conflict, ""))
	if _, err := f.client().Launch(context.Background(), testLease().LeaseID, testProof, LaunchSpec{Argv: []string{"x"}}); !errors.Is(err, errcode.ErrConflict) || len(f.requests()) != 1 {
		t.Errorf("a different launch: %v after %d requests", err, len(f.requests()))
	}
	f = newFake(t, fail(404, errcode.NotFound, ""))
	if _, err := f.client().WaitLaunch(context.Background(), testLease().LeaseID, time.Millisecond); !errors.Is(err, errcode.ErrNotFound) {
		t.Errorf("WaitLaunch without a launch: %v", err)
	}
}
