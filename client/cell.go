package client

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// The lease operations that reach the cell's agent (CONTRACT §14): a
// streamed exec, the resident launch, and files.

// Stream names an output stream of a command.
type Stream string

// Output streams.
const (
	Stdout Stream = wire.EventStdout
	Stderr Stream = wire.EventStderr
)

// Output is one chunk of a streamed command's output, in the order the
// command produced it.
type Output struct {
	Stream Stream
	Data   []byte
}

// ExecStream runs cmd in the cell of a live lease like [Client.Run], but
// hands its output to out as the command produces it (POST
// /v1/sterile-cell-leases/{id}/exec with Accept: text/event-stream); the
// result then carries no Stdout or Stderr. An error from out closes the
// stream — the server then stops the command — and is returned.
//
// ExecStream is sent once and never retried: a repeat would run the
// command again, and a stream is never replayed (cmd.IdempotencyKey is
// refused). A failure the server reports after the command started (the
// cell died, say) is an *Error like any other, whose Status is the one
// its code has everywhere else; a stream that ends without an exit event
// is an error wrapping io.ErrUnexpectedEOF: the command's outcome is then
// unknown.
func (c *Client) ExecStream(ctx context.Context, leaseID uuid.UUID, proof wire.LeaseProof, cmd Command, out func(Output) error) (ExecResult, error) {
	if cmd.IdempotencyKey != "" {
		return ExecResult{}, errors.New("client: a streamed exec takes no idempotency key: it is never replayed")
	}
	req, err := cmd.Request(proof)
	if err != nil {
		return ExecResult{}, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return ExecResult{}, fmt.Errorf("client: encode request: %w", err)
	}
	resp, _, _, err := c.open(ctx, request{method: http.MethodPost, path: leasePath(leaseID, "/exec"), accept: "text/event-stream"},
		bytes.NewReader(body), "application/json")
	if err != nil {
		return ExecResult{}, err
	}
	defer resp.Body.Close()
	if mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); mt != "text/event-stream" {
		return ExecResult{}, fmt.Errorf("client: exec: the server answered %q, not an event stream", mt)
	}
	return readExecStream(resp, out)
}

// readExecStream reads the events of a streamed exec until its exit or
// error event. Events of other names are ignored.
func readExecStream(resp *http.Response, out func(Output) error) (ExecResult, error) {
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), MaxResponseBytes)
	var event string
	var data []byte
	hasData := false
	for sc.Scan() {
		line := strings.TrimSuffix(sc.Text(), "\r")
		if line != "" { // a field of the next event, or a comment (no field name)
			field, value, _ := strings.Cut(line, ":")
			value = strings.TrimPrefix(value, " ")
			switch field {
			case "event":
				event = value
			case "data":
				if hasData {
					data = append(data, '\n')
				}
				data, hasData = append(data, value...), true
			}
			continue
		}
		name, payload, dispatch := event, data, hasData
		event, data, hasData = "", nil, false
		if !dispatch {
			continue
		}
		switch name {
		case wire.EventStdout, wire.EventStderr:
			var o wire.ExecOutput
			if err := json.Unmarshal(payload, &o); err != nil {
				return ExecResult{}, fmt.Errorf("client: exec stream: %s event: %w", name, err)
			}
			b, err := base64.StdEncoding.DecodeString(o.DataBase64)
			if err != nil {
				return ExecResult{}, fmt.Errorf("client: exec stream: %s event: %w", name, err)
			}
			if err := out(Output{Stream: Stream(name), Data: b}); err != nil {
				return ExecResult{}, err
			}
		case wire.EventExit:
			var e wire.ExecExit
			if err := json.Unmarshal(payload, &e); err != nil {
				return ExecResult{}, fmt.Errorf("client: exec stream: exit event: %w", err)
			}
			return exitResult(e), nil
		case wire.EventError:
			var e wire.StreamError
			if err := json.Unmarshal(payload, &e); err != nil || e.Code == "" {
				return ExecResult{}, fmt.Errorf("client: exec stream: an error event without a code: %s", payload)
			}
			code := errcode.Code(e.Code)
			return ExecResult{}, &Error{Status: code.HTTPStatus(), Code: code, Message: e.Message, RequestID: resp.Header.Get("X-Request-Id")}
		}
	}
	err := sc.Err()
	if err == nil {
		err = io.ErrUnexpectedEOF
	}
	return ExecResult{}, fmt.Errorf("client: exec stream ended without an exit event; the command's outcome is unknown: %w", err)
}

// LaunchSpec is the resident workload of [Client.Launch].
type LaunchSpec struct {
	// Argv is the program and its arguments (1 to 256 strings).
	Argv []string
	// Env adds environment variables (at most 64).
	Env map[string]string
	// Cwd is the absolute working directory; empty means the cell's home.
	Cwd string
	// User is wire.UserCell (empty too) or wire.UserRoot.
	User string
}

// Launch starts the lease's one resident workload and returns its status
// (POST /v1/sterile-cell-leases/{id}/launch). The server launches once per
// lease: an exact repeat answers the launch already made, so Launch
// retries like a fenced claim — a lost answer never starts a second
// workload. A different spec is errcode.ErrConflict. Its stdout and stderr
// go to /home/cell/.launch/stdout and …/stderr in the cell
// ([Client.ReadFile]).
func (c *Client) Launch(ctx context.Context, leaseID uuid.UUID, proof wire.LeaseProof, spec LaunchSpec) (wire.Launch, error) {
	var resp wire.LaunchResponse
	body := wire.LaunchRequest{LeaseProof: proof, Argv: spec.Argv, Cwd: spec.Cwd, Env: spec.Env, User: spec.User}
	err := c.do(ctx, request{method: http.MethodPost, path: leasePath(leaseID, "/launch"), body: body, retry: true}, &resp)
	return resp.Launch, err
}

// LaunchStatus returns the status of a lease's launched workload (GET
// /v1/sterile-cell-leases/{id}/launch); errcode.ErrNotFound when there is
// none.
func (c *Client) LaunchStatus(ctx context.Context, leaseID uuid.UUID) (wire.Launch, error) {
	var resp wire.LaunchResponse
	err := c.do(ctx, request{method: http.MethodGet, path: leasePath(leaseID, "/launch"), retry: true}, &resp)
	return resp.Launch, err
}

// WaitLaunch polls the launch status every poll (DefaultPoll when poll <=
// 0) until the workload is terminal, and returns that status. Transient
// failures keep it polling; any other error ends it. When ctx ends first
// it returns the last status it read and an error wrapping ctx.Err().
func (c *Client) WaitLaunch(ctx context.Context, leaseID uuid.UUID, poll time.Duration) (wire.Launch, error) {
	if poll <= 0 {
		poll = DefaultPoll
	}
	var last wire.Launch
	for {
		st, err := c.LaunchStatus(ctx, leaseID)
		switch {
		case err == nil && st.Phase == wire.PhaseTerminal:
			return st, nil
		case err == nil:
			last = st
		case ctx.Err() != nil:
			return last, fmt.Errorf("client: waiting for the launch of lease %s: %w", leaseID, ctx.Err())
		case !transient(err):
			return last, err
		}
		if err := c.sleep(ctx, poll); err != nil {
			return last, fmt.Errorf("client: waiting for the launch of lease %s: %w", leaseID, err)
		}
	}
}

// FileWrite names a file for [Client.WriteFile].
type FileWrite struct {
	// Path is absolute, resolved inside the cell.
	Path string
	// Mode is the file's permission bits (no other mode bits); zero means
	// 0644.
	Mode fs.FileMode
	// User writes the file: wire.UserCell (empty too) or wire.UserRoot.
	User string
}

// WriteFile streams content into a file of the cell of a live lease (POST
// /v1/sterile-cell-leases/{id}/files/write, multipart/form-data): parent
// directories are created and the file is replaced atomically. content is
// read as it is sent, never held whole in memory; more than 256 MiB is
// errcode.ErrPayloadTooLarge and nothing is written. The request ends
// with its closing boundary only when content ends with io.EOF: any other
// error of content aborts it, and the cell keeps its old file. A Path
// ending in "/" is errcode.ErrInvalidRequest. WriteFile returns once it
// has stopped reading content.
//
// WriteFile is sent once and never retried: content is consumed by the
// attempt. A repeat with the same content is harmless (the file is
// replaced), so a caller who can read content again may retry itself.
func (c *Client) WriteFile(ctx context.Context, leaseID uuid.UUID, proof wire.LeaseProof, f FileWrite, content io.Reader) (wire.FileWriteResponse, error) {
	var out wire.FileWriteResponse
	if f.Mode&^fs.ModePerm != 0 {
		return out, fmt.Errorf("client: file mode %v has bits other than permissions", f.Mode)
	}
	req := wire.FileWriteRequest{LeaseProof: proof, Path: f.Path, User: f.User}
	if f.Mode != 0 {
		req.Mode = fmt.Sprintf("%04o", uint32(f.Mode))
	}
	proofJSON, err := json.Marshal(req)
	if err != nil {
		return out, fmt.Errorf("client: encode request: %w", err)
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(writeUpload(mw, proofJSON, content))
	}()
	resp, _, _, err := c.open(ctx, request{method: http.MethodPost, path: leasePath(leaseID, "/files/write")}, pr, mw.FormDataContentType())
	// The server may answer before it read everything (a refusal): stop
	// the writer, and wait until it no longer reads content.
	pr.CloseWithError(errors.New("client: the server answered"))
	<-done
	if err != nil {
		return out, err
	}
	defer resp.Body.Close()
	data, err := readAnswer(resp)
	if err != nil {
		return out, err
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return out, fmt.Errorf("client: files/write: decoding the %d response: %w", resp.StatusCode, err)
	}
	return out, nil
}

// writeUpload writes the parts of a file write: proof, then content.
func writeUpload(mw *multipart.Writer, proof []byte, content io.Reader) error {
	pw, err := mw.CreatePart(textproto.MIMEHeader{
		"Content-Disposition": {`form-data; name="` + wire.PartProof + `"`},
		"Content-Type":        {"application/json"},
	})
	if err == nil {
		_, err = pw.Write(proof)
	}
	if err == nil {
		pw, err = mw.CreatePart(textproto.MIMEHeader{
			"Content-Disposition": {`form-data; name="` + wire.PartContent + `"; filename="content"`},
			"Content-Type":        {"application/octet-stream"},
		})
	}
	if err == nil {
		_, err = io.Copy(pw, content)
	}
	if err == nil {
		err = mw.Close()
	}
	return err
}

// FileRead names a file for [Client.ReadFile].
type FileRead struct {
	// Path is absolute, resolved inside the cell.
	Path string
	// MaxBytes refuses a larger file with errcode.ErrPayloadTooLarge; zero
	// means the server's bound, 256 MiB.
	MaxBytes int64
	// User reads the file: wire.UserCell (empty too) or wire.UserRoot.
	User string
}

// ReadFile opens a file of the cell of a live lease (POST
// /v1/sterile-cell-leases/{id}/files/read) and returns its content, read
// from the server as the caller reads it, and its size. The caller closes
// the reader; it stays bound to ctx. A missing file is
// errcode.ErrFileNotFound, one the cell may not read
// errcode.ErrFileAccessDenied, one larger than f.MaxBytes
// errcode.ErrPayloadTooLarge.
//
// Reading changes nothing, so the request is retried like a read until
// the content starts; a body cut short after that is an error of the
// reader (io.ErrUnexpectedEOF), never a shorter file.
func (c *Client) ReadFile(ctx context.Context, leaseID uuid.UUID, proof wire.LeaseProof, f FileRead) (io.ReadCloser, int64, error) {
	if f.MaxBytes < 0 {
		return nil, 0, errors.New("client: negative MaxBytes")
	}
	req := wire.FileReadRequest{LeaseProof: proof, Path: f.Path, User: f.User}
	if f.MaxBytes > 0 {
		m := uint64(f.MaxBytes)
		req.MaxBytes = &m
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, 0, fmt.Errorf("client: encode request: %w", err)
	}
	var resp *http.Response
	r := request{method: http.MethodPost, path: leasePath(leaseID, "/files/read"), accept: "application/octet-stream"}
	err = c.retry(ctx, true, func() (bool, time.Duration, error) {
		var retryable bool
		var wait time.Duration
		var err error
		resp, retryable, wait, err = c.open(ctx, r, bytes.NewReader(body), "application/json")
		return retryable, wait, err
	})
	if err != nil {
		return nil, 0, err
	}
	if resp.ContentLength < 0 {
		resp.Body.Close()
		return nil, 0, errors.New("client: files/read: the answer has no Content-Length")
	}
	return resp.Body, resp.ContentLength, nil
}
