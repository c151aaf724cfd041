package httpapi

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// The lease operations that reach the cell (CONTRACT §6, §14): exec, as
// one JSON answer or as an event stream; launch and its status; files
// written from a multipart body and read as raw bytes.

const (
	// maxTimeoutSeconds bounds timeout_seconds before it becomes a
	// Duration. A command outlives its lease's expiry only if the lease
	// is renewed: the cell kills it at the expiry.
	maxTimeoutSeconds = 24 * 60 * 60
	// maxStoredExecStream caps each output stream of a JSON exec answer
	// kept by an Idempotency-Key record (its replay is cut there, with
	// truncated set); an exec with an Idempotency-Key may ask for no larger
	// max_output_bytes (CONTRACT §25).
	maxStoredExecStream = 1 << 20
	// MaxFileBytes bounds a file written or read through the file routes
	// (413 payload_too_large beyond).
	MaxFileBytes = sandboxwich.MaxFileBytes
	// maxUploadBytes bounds a whole file write body: the proof part, the
	// content and the multipart framing.
	maxUploadBytes = MaxFileBytes + MaxBodyBytes + 64<<10
)

var (
	errMultipartType = errcode.New(errcode.UnsupportedMediaType, "the request body must be multipart/form-data with a boundary")
	errProofType     = errcode.New(errcode.UnsupportedMediaType, "the proof part must be application/json")
	errFileTooLarge  = tooLarge("the file", MaxFileBytes)
)

// decodeExec reads an exec request (JSON or streamed).
func (h *handler) decodeExec(c *call) (uuid.UUID, sandboxwich.Proof, sandboxwich.ExecRequest, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return uuid.Nil, sandboxwich.Proof{}, sandboxwich.ExecRequest{}, err
	}
	req, err := decodeBody(c.body, readExec)
	if err != nil {
		return uuid.Nil, sandboxwich.Proof{}, sandboxwich.ExecRequest{}, err
	}
	stdin, err := base64.StdEncoding.DecodeString(req.StdinBase64)
	if err != nil {
		return uuid.Nil, sandboxwich.Proof{}, sandboxwich.ExecRequest{}, invalid("stdin_base64 must be standard base64")
	}
	var timeout time.Duration
	if req.TimeoutSeconds != nil {
		timeout = time.Duration(min(*req.TimeoutSeconds, maxTimeoutSeconds)) * time.Second
	}
	var maxOutput int
	if v := req.MaxOutputBytes; v != nil {
		// The plane reads zero as its default; on the wire it would mean
		// "nothing", so it is refused rather than reinterpreted. A value
		// beyond any ceiling stays beyond it, for the plane to refuse.
		ceiling := h.plane.ExecMaxOutputCeiling()
		if *v == 0 {
			return uuid.Nil, sandboxwich.Proof{}, sandboxwich.ExecRequest{}, invalid("max_output_bytes must be 1 to " + strconv.Itoa(ceiling) + " (the server's ceiling)")
		}
		maxOutput = int(min(*v, uint64(sandboxwich.MaxExecOutputLimit)+1))
	}
	return id, proofOf(req.LeaseProof), sandboxwich.ExecRequest{
		Argv: req.Argv, Stdin: stdin, Env: req.Env, Cwd: req.Cwd, User: sandboxwich.User(req.User), Timeout: timeout,
		MaxOutput: maxOutput,
	}, nil
}

// errIdemOutput refuses an Idempotency-Key on an exec that asks for more
// output than an idempotency record keeps.
var errIdemOutput = errcode.New(errcode.InvalidIdempotencyKey,
	"Idempotency-Key is not accepted with max_output_bytes above 1048576: a stored answer keeps at most 1 MiB of each stream")

// execKeyCheck refuses an Idempotency-Key on a JSON exec whose
// max_output_bytes is above maxStoredExecStream (CONTRACT §25). A body
// that does not parse is left to the route, which refuses it.
func execKeyCheck(c *call) error {
	var b struct {
		MaxOutputBytes json.Number `json:"max_output_bytes"`
	}
	if json.Unmarshal(c.body, &b) != nil || b.MaxOutputBytes == "" {
		return nil
	}
	n, err := strconv.ParseUint(string(b.MaxOutputBytes), 10, 64)
	if (err == nil && n > maxStoredExecStream) || errors.Is(err, strconv.ErrRange) {
		return errIdemOutput
	}
	return nil
}

// exec serves POST /v1/sterile-cell-leases/{lease_id}/exec with a JSON
// answer.
func (h *handler) exec(c *call) (int, any, error) {
	id, pr, req, err := h.decodeExec(c)
	if err != nil {
		return 0, nil, err
	}
	outlive(c, req)
	res, err := h.plane.Exec(c.ctx(), c.p.tenant, id, pr, req)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, execAnswer{res: res, outCap: h.plane.ExecOutputCap(req)}, nil
}

// outlive moves the answer's write deadline past the command's timeout: a
// command of a renewed lease may run longer than the server's write
// timeout, which bounds the other answers (CONTRACT §20).
func outlive(c *call, req sandboxwich.ExecRequest) {
	timeout := req.Timeout
	if timeout == 0 {
		timeout = sandboxwich.DefaultExecTimeout
	}
	_ = http.NewResponseController(c.w).SetWriteDeadline(time.Now().Add(timeout + time.Minute))
}

// execAnswer is a JSON exec's answer and the cap of each stream that
// applied. Its idempotency record keeps at most maxStoredExecStream bytes
// of each stream.
type execAnswer struct {
	res    sandboxwich.ExecResult
	outCap int
}

// MarshalJSON encodes the whole answer.
func (a execAnswer) MarshalJSON() ([]byte, error) {
	return json.Marshal(execResponse(a.res, a.outCap, math.MaxInt))
}

func (a execAnswer) storedForm() any {
	if len(a.res.Stdout) <= maxStoredExecStream && len(a.res.Stderr) <= maxStoredExecStream {
		return nil
	}
	return execResponse(a.res, min(a.outCap, maxStoredExecStream), maxStoredExecStream)
}

// execResponse is the wire answer of res, whose streams were capped at
// outCap bytes, with each stream cut at limit bytes (truncated set when
// one was).
func execResponse(res sandboxwich.ExecResult, outCap, limit int) wire.ExecResponse {
	out := wire.ExecResponse{ExecExit: execExit(res, outCap)}
	stdout, stderr := res.Stdout, res.Stderr
	if len(stdout) > limit || len(stderr) > limit {
		stdout, stderr = stdout[:min(len(stdout), limit)], stderr[:min(len(stderr), limit)]
		out.Truncated = true
	}
	out.StdoutBase64 = base64.StdEncoding.EncodeToString(stdout)
	out.StderrBase64 = base64.StdEncoding.EncodeToString(stderr)
	return out
}

// execExit is how a command ended, in wire form, with the cap of each
// stream that applied. A provider that reports no reason (provider exec
// without the agent) ended it by exit or timeout.
func execExit(res sandboxwich.ExecResult, outCap int) wire.ExecExit {
	e := wire.ExecExit{OK: true, ExitCode: res.ExitCode, Truncated: res.Truncated, MaxOutputBytes: outCap,
		DurationMS: res.Duration.Milliseconds(), TimedOut: res.TimedOut, Reason: string(res.Reason), Message: res.Message}
	if res.Signal != "" {
		e.Signal = &res.Signal
	}
	if e.Reason == "" {
		e.Reason = wire.ReasonExited
		if res.TimedOut {
			e.Reason = wire.ReasonTimedOut
		}
	}
	return e
}

// acceptsEventStream reports whether Accept lists text/event-stream (with
// a q above 0).
func acceptsEventStream(accept []string) bool {
	for _, v := range accept {
		for r := range strings.SplitSeq(v, ",") {
			mt, params, err := mime.ParseMediaType(r)
			if err != nil || mt != "text/event-stream" {
				continue
			}
			if q, ok := params["q"]; ok {
				if f, err := strconv.ParseFloat(q, 64); err != nil || f <= 0 {
					continue
				}
			}
			return true
		}
	}
	return false
}

// execStream serves POST /v1/sterile-cell-leases/{lease_id}/exec with
// Accept: text/event-stream: stdout and stderr events in the order
// produced, keep-alive comments, then one exit event. A failure before the
// stream was committed (by the first output or keep-alive) is an ordinary
// JSON error; after it, an error event, and no exit.
func (h *handler) execStream(c *call, w http.ResponseWriter) {
	id, pr, req, err := h.decodeExec(c)
	if err != nil {
		h.writeError(w, c.r, err)
		return
	}
	outlive(c, req)
	s := newEventStream(w, h.keepAlive)
	res, err := h.plane.ExecStream(c.ctx(), c.p.tenant, id, pr, req, func(o sandboxwich.Output) error {
		var event string
		switch o.Stream {
		case sandboxwich.Stdout:
			event = wire.EventStdout
		case sandboxwich.Stderr:
			event = wire.EventStderr
		default:
			return errors.New("httpapi: output of an unknown stream " + strconv.Quote(string(o.Stream)))
		}
		if len(o.Data) == 0 {
			return s.commit()
		}
		return s.send(event, wire.ExecOutput{DataBase64: base64.StdEncoding.EncodeToString(o.Data)})
	})
	committed := s.stop()
	switch {
	case err != nil && !committed:
		h.writeError(w, c.r, err)
	case err != nil:
		_, code, msg := h.wireError(c.r, err)
		_ = s.send(wire.EventError, wire.StreamError{Code: string(code), Message: msg})
	default:
		_ = s.send(wire.EventExit, execExit(res, h.plane.ExecOutputCap(req)))
	}
}

// launch serves POST /v1/sterile-cell-leases/{lease_id}/launch: 202 for a
// new launch, 200 for an exact replay.
func (h *handler) launch(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return 0, nil, err
	}
	req, err := decodeBody(c.body, readLaunch)
	if err != nil {
		return 0, nil, err
	}
	st, created, err := h.plane.Launch(c.ctx(), c.p.tenant, id, proofOf(req.LeaseProof), sandboxwich.LaunchRequest{
		Argv: req.Argv, Env: req.Env, Cwd: req.Cwd, User: sandboxwich.User(req.User),
	})
	if err != nil {
		return 0, nil, err
	}
	status := http.StatusOK
	if created {
		status = http.StatusAccepted
	}
	return status, wire.LaunchResponse{OK: true, Launch: wireLaunch(st)}, nil
}

// launchStatus serves GET /v1/sterile-cell-leases/{lease_id}/launch.
func (h *handler) launchStatus(c *call) (int, any, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return 0, nil, err
	}
	st, err := h.plane.LaunchStatusOf(c.ctx(), c.p.tenant, id)
	if err != nil {
		return 0, nil, err
	}
	return http.StatusOK, wire.LaunchResponse{OK: true, Launch: wireLaunch(st)}, nil
}

// wireLaunch is a launch status in wire form.
func wireLaunch(st sandboxwich.LaunchStatus) wire.Launch {
	l := wire.Launch{Phase: string(st.Phase), PID: st.PID, ExitCode: st.ExitCode, Signal: st.Signal}
	if st.Reason != nil {
		l.Reason = ptr(string(*st.Reason))
	}
	return l
}

// writeFile serves POST /v1/sterile-cell-leases/{lease_id}/files/write: a
// multipart/form-data body whose first part, proof, is the JSON request and
// whose second, content, is streamed into the cell as it arrives — never
// held whole in memory. The cell writes the file only when the content
// part ended at its boundary and the body closed cleanly after it (parts
// after content are read and ignored): more than MaxFileBytes of content
// is 413, a body cut short 400, and either way the cell keeps its old
// file.
func (h *handler) writeFile(c *call, w http.ResponseWriter) {
	info, err := h.upload(c, w)
	if err != nil {
		h.writeError(w, c.r, err)
		return
	}
	rep, err := jsonReply(http.StatusOK, wire.FileWriteResponse{OK: true, Path: info.Path, Size: info.Size, SHA256: info.SHA256})
	if err != nil {
		h.writeError(w, c.r, err)
		return
	}
	h.write(w, rep)
}

// upload reads the parts of a file write and hands the content to the
// plane.
func (h *handler) upload(c *call, w http.ResponseWriter) (sandboxwich.FileInfo, error) {
	var none sandboxwich.FileInfo
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return none, err
	}
	mt, params, err := mime.ParseMediaType(c.r.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/form-data" || params["boundary"] == "" {
		return none, errMultipartType
	}
	if c.r.ContentLength > maxUploadBytes {
		return none, errFileTooLarge
	}
	// The server's read timeout bounds the request until the plane has
	// checked the proof and found the lease: a caller that never sends its
	// proof, or names no lease, is cut off like any slow request. Only
	// when the content starts flowing into the cell (contentReader) does
	// the upload's own bound take over.
	mr := multipart.NewReader(http.MaxBytesReader(w, c.r.Body, maxUploadBytes), params["boundary"])

	part, err := nextPart(mr, wire.PartProof)
	if err != nil {
		return none, err
	}
	if !jsonContentType(part.Header.Get("Content-Type")) {
		return none, errProofType
	}
	body, err := io.ReadAll(io.LimitReader(part, MaxBodyBytes+1))
	switch {
	case err != nil:
		return none, bodyError(err)
	case len(body) > MaxBodyBytes:
		return none, tooLarge("the proof part", MaxBodyBytes)
	}
	req, err := decodeBody(body, readFileWrite)
	if err != nil {
		return none, err
	}
	mode, err := parseMode(req.Mode)
	if err != nil {
		return none, err
	}
	if part, err = nextPart(mr, wire.PartContent); err != nil {
		return none, err
	}
	content := &contentReader{r: part, left: MaxFileBytes, rc: http.NewResponseController(w), idle: h.uploadIdle, rest: mr}
	info, err := h.plane.WriteFile(c.ctx(), c.p.tenant, id, proofOf(req.LeaseProof),
		sandboxwich.WriteFileRequest{Path: req.Path, Mode: mode, User: sandboxwich.User(req.User)}, content)
	switch {
	case content.over:
		return none, errFileTooLarge
	case content.err != nil:
		return none, bodyError(content.err)
	case err != nil && c.ctx().Err() != nil:
		// The client closed its side before the content ended: the cell
		// wrote nothing, and the body was cut short.
		return none, malformed("the request ended before its content did; nothing was written")
	case err != nil:
		return none, err
	}
	return info, nil
}

// nextPart returns the next part of a multipart body, which must be name.
func nextPart(mr *multipart.Reader, name string) (*multipart.Part, error) {
	part, err := mr.NextPart()
	switch {
	case err == io.EOF: //nolint:errorlint // only the unwrapped EOF is the body's clean end; a wrapped one is a malformed body
		return nil, invalid("the multipart body has no " + name + " part")
	case err != nil:
		return nil, bodyError(err)
	case part.FormName() != name:
		return nil, invalid("the multipart body's parts must be proof, then content")
	}
	return part, nil
}

// bodyError is the answer to a request body that could not be read: 413
// past its bound, else a malformed body.
func bodyError(err error) error {
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return errFileTooLarge
	}
	return malformed("the multipart body could not be read")
}

// contentReader hands a file's content to the plane: at most left bytes;
// one more is an error (over), so the cell never commits a file that is
// too large. It ends with io.EOF only when the content part ended at its
// boundary and the multipart body closed cleanly after it (rest); a body
// cut short, a missing closing boundary or a short Content-Length is an
// error (err), so the cell writes nothing.
//
// Its first read comes once the plane has checked the proof and found the
// lease: from then on the read deadline is idle past the last read that
// made progress (rc), instead of the server's read timeout — a large file
// takes its time, a stalled one is cut off.
type contentReader struct {
	r    io.Reader
	left int64
	over bool
	err  error

	rc      *http.ResponseController
	idle    time.Duration
	armedAt time.Time // when the deadline was last pushed

	rest *multipart.Reader
}

var errContentTooLarge = errors.New("httpapi: the file is larger than 256 MiB")

func (c *contentReader) Read(p []byte) (int, error) {
	if c.over {
		return 0, errContentTooLarge
	}
	if c.err != nil {
		return 0, c.err
	}
	if c.armedAt.IsZero() {
		c.progress() // the first read: the upload's own bound begins
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	if int64(n) > c.left {
		c.over = true
		return int(c.left), errContentTooLarge
	}
	c.left -= int64(n)
	if n > 0 {
		c.progress()
	}
	switch {
	case err == io.EOF: //nolint:errorlint // only the part's own EOF is its boundary
		if ferr := c.finish(); ferr != nil {
			c.err = ferr
			return n, ferr
		}
	case err != nil:
		c.err = err
	}
	return n, err
}

// progress pushes the read deadline to idle from now (at most every
// idle/8, so that a fast upload does not reset it on every read).
func (c *contentReader) progress() {
	if c.rc == nil || c.idle <= 0 {
		return
	}
	now := time.Now()
	if !c.armedAt.IsZero() && now.Sub(c.armedAt) < c.idle/8 {
		return
	}
	c.armedAt = now
	_ = c.rc.SetReadDeadline(now.Add(c.idle))
}

// finish reads the multipart body past the content part to its closing
// boundary (parts after content are read and ignored): the content counts
// as complete only then.
func (c *contentReader) finish() error {
	if c.rest == nil {
		return nil
	}
	for {
		part, err := c.rest.NextPart()
		if err == io.EOF { //nolint:errorlint // only the unwrapped EOF is the body's clean end
			return nil
		}
		if err != nil {
			return err
		}
		if _, err := io.Copy(io.Discard, part); err != nil {
			return err
		}
		c.progress()
	}
}

// parseMode parses a file mode: permission bits as an octal string of 3 or
// 4 digits ("0644", the default when empty). 0000 is refused: the plane
// reads a zero mode as the default.
func parseMode(s string) (fs.FileMode, error) {
	if s == "" {
		return 0o644, nil
	}
	v, err := strconv.ParseUint(s, 8, 32)
	if err != nil || len(s) < 3 || len(s) > 4 || v > 0o777 {
		return 0, invalid("mode must be permission bits as an octal string, like \"0644\"")
	}
	if v == 0 {
		return 0, invalid("mode 0000 is not supported")
	}
	return fs.FileMode(v), nil
}

// readFile serves POST /v1/sterile-cell-leases/{lease_id}/files/read: the
// file's bytes as application/octet-stream with their Content-Length. A
// cell that stops sending before the end aborts the response, so the
// client sees a short body, never a shorter file.
func (h *handler) readFile(c *call, w http.ResponseWriter) {
	rc, size, err := h.openFile(c)
	if err != nil {
		h.writeError(w, c.r, err)
		return
	}
	defer rc.Close()
	hd := w.Header()
	hd.Set("Content-Type", "application/octet-stream")
	hd.Set("Content-Length", strconv.FormatInt(size, 10))
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if _, err := io.CopyN(w, rc, size); err != nil {
		h.log.LogAttrs(c.ctx(), slog.LevelInfo, "httpapi: file read cut short",
			slog.String("request_id", requestIDOf(c.ctx())), slog.String("error", err.Error()))
		panic(http.ErrAbortHandler)
	}
}

// openFile reads a file read request and opens the file.
func (h *handler) openFile(c *call) (io.ReadCloser, int64, error) {
	id, err := pathUUID(c.r, "lease_id")
	if err != nil {
		return nil, 0, err
	}
	req, err := decodeBody(c.body, readFileRead)
	if err != nil {
		return nil, 0, err
	}
	var maxBytes int64
	if req.MaxBytes != nil {
		// The plane reads zero as its default; on the wire it would mean
		// "nothing", so it is refused rather than reinterpreted.
		if *req.MaxBytes == 0 || *req.MaxBytes > MaxFileBytes {
			return nil, 0, invalid("max_bytes must be 1 to 268435456")
		}
		maxBytes = int64(*req.MaxBytes)
	}
	return h.plane.ReadFile(c.ctx(), c.p.tenant, id, proofOf(req.LeaseProof),
		sandboxwich.ReadFileRequest{Path: req.Path, MaxBytes: maxBytes, User: sandboxwich.User(req.User)})
}

func readLaunch(o *object) wire.LaunchRequest {
	return wire.LaunchRequest{
		LeaseProof: readProof(o),
		Argv:       o.strs("argv"),
		Cwd:        o.optStr("cwd"),
		Env:        o.optStrMap("env"),
		User:       o.optEnum("user", users...),
	}
}

func readFileWrite(o *object) wire.FileWriteRequest {
	return wire.FileWriteRequest{
		LeaseProof: readProof(o),
		Path:       o.str("path"),
		Mode:       o.optStr("mode"),
		User:       o.optEnum("user", users...),
	}
}

func readFileRead(o *object) wire.FileReadRequest {
	return wire.FileReadRequest{
		LeaseProof: readProof(o),
		Path:       o.str("path"),
		MaxBytes:   o.optUint("max_bytes"),
		User:       o.optEnum("user", users...),
	}
}
