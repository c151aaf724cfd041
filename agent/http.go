package agent

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
)

// The HTTP form of the protocol, served by NewHandler and spoken by
// Client. Every body is JSON except where noted:
//
//	GET  /v1/status        → Status
//	POST /v1/activate      Activation → {"ok":true}
//	POST /v1/release       Fence → {"ok":true}
//	POST /v1/exec          ExecRequest → 200 application/x-ndjson: output
//	                       frames {"stream","data"} in the order produced,
//	                       then one {"result":ExecResult} or {"error":…};
//	                       with ?collect=1 no output frames, the result
//	                       carries the output
//	POST /v1/launch        LaunchRequest → LaunchStatus
//	POST /v1/launch/status Fence → LaunchStatus
//	POST /v1/files/write   one line of WriteRequest JSON, then the
//	                       content (streamed) in frames: a length (4
//	                       bytes, big-endian, at most maxFrame) and that
//	                       many bytes, ended by a frame of length 0 →
//	                       FileInfo. A body that ends without the end
//	                       frame writes nothing (Client sends it only
//	                       once its source ended cleanly)
//	POST /v1/files/read    ReadRequest → 200 application/octet-stream, the
//	                       bytes, Content-Length their size
//
// A refusal is a non-200 answer {"code","message"} (an *Error on the
// client); an agent failure that is no decision is 500 with code
// "internal", which the client returns as an error that is not an *Error.

// Bounds of the HTTP form.
const (
	// maxJSONBody bounds a JSON request body: an exec carries up to
	// MaxStdin bytes of stdin, base64-encoded, plus MaxArgsBytes of argv
	// and env, which JSON may escape to 6 bytes each (\u00XX), so that
	// every request the plane admits reaches the agent whole.
	maxJSONBody = (MaxStdin+2)/3*4 + 6*MaxArgsBytes + 64<<10
	// maxHeaderLine bounds the JSON header line of a file write.
	maxHeaderLine = 64 << 10
	// maxErrorBody bounds an error answer the client reads.
	maxErrorBody = 64 << 10
)

// Frames of a file write's content, on the wire (the files/write route)
// and between the agent and its helper alike: a length prefix of
// frameHeader bytes, big-endian, then at most maxFrame bytes; length 0
// ends the content.
const (
	frameHeader = 4
	maxFrame    = 1 << 20
)

// codeInternal marks an agent failure that is not a decision.
const codeInternal Code = "internal"

// execFrame is one line of an exec answer.
type execFrame struct {
	Stream Stream      `json:"stream,omitempty"`
	Data   []byte      `json:"data,omitempty"`
	Result *ExecResult `json:"result,omitempty"`
	Error  *Error      `json:"error,omitempty"`
}

// statusOf is the HTTP status of an agent error.
func httpStatus(c Code) int {
	switch c {
	case CodeFenceRefused, CodeNotActive, CodeConflict:
		return http.StatusConflict
	case CodeExpired:
		return http.StatusGone
	case CodeInvalid, CodeUserUnsupported:
		return http.StatusUnprocessableEntity
	case CodeNotFound, CodeNotLaunched:
		return http.StatusNotFound
	case CodeAccessDenied:
		return http.StatusForbidden
	case CodeTooLarge:
		return http.StatusRequestEntityTooLarge
	case CodeNoSpace:
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

// knownCode reports whether c is one of the protocol's codes.
func knownCode(c Code) bool { return httpStatus(c) != http.StatusInternalServerError }

// asError is err as the wire carries it.
func asError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		return e
	}
	return &Error{Code: codeInternal, Message: err.Error()}
}

// NewHandler serves c over HTTP (see the routes above).
func NewHandler(c Conn) http.Handler {
	h := &handler{c: c}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/status", h.status)
	mux.HandleFunc("POST /v1/activate", h.activate)
	mux.HandleFunc("POST /v1/release", h.release)
	mux.HandleFunc("POST /v1/exec", h.exec)
	mux.HandleFunc("POST /v1/launch", h.launch)
	mux.HandleFunc("POST /v1/launch/status", h.launchStatus)
	mux.HandleFunc("POST /v1/files/write", h.writeFile)
	mux.HandleFunc("POST /v1/files/read", h.readFile)
	return mux
}

type handler struct{ c Conn }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	e := asError(err)
	writeJSON(w, httpStatus(e.Code), e)
}

// decode reads one bounded JSON body into v; a bad body is ErrInvalid
// (ErrTooLarge when over the bound).
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	d := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody))
	d.DisallowUnknownFields()
	if err := d.Decode(v); err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, Errorf(CodeTooLarge, fmt.Sprintf("the request body is larger than %d bytes", maxJSONBody)))
		} else {
			writeError(w, Errorf(CodeInvalid, "bad request body: "+err.Error()))
		}
		return false
	}
	return true
}

func (h *handler) status(w http.ResponseWriter, r *http.Request) {
	st, err := h.c.Status(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

var okBody = map[string]bool{"ok": true}

func (h *handler) activate(w http.ResponseWriter, r *http.Request) {
	var a Activation
	if !decode(w, r, &a) {
		return
	}
	if err := h.c.Activate(r.Context(), a); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, okBody)
}

func (h *handler) release(w http.ResponseWriter, r *http.Request) {
	var f Fence
	if !decode(w, r, &f) {
		return
	}
	if err := h.c.Release(r.Context(), f); err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, okBody)
}

func (h *handler) exec(w http.ResponseWriter, r *http.Request) {
	var req ExecRequest
	if !decode(w, r, &req) {
		return
	}
	flusher, _ := w.(http.Flusher)
	enc := json.NewEncoder(w)
	started := false
	emit := func(f execFrame) error {
		if !started {
			started = true
			w.Header().Set("Content-Type", "application/x-ndjson")
			w.WriteHeader(http.StatusOK)
		}
		if err := enc.Encode(f); err != nil {
			return err
		}
		if flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	var out func(Output) error
	if r.URL.Query().Get("collect") != "1" {
		out = func(o Output) error { return emit(execFrame{Stream: o.Stream, Data: o.Data}) }
	}
	res, err := h.c.Exec(r.Context(), req, out)
	switch {
	case err != nil && !started:
		writeError(w, err)
	case err != nil:
		_ = emit(execFrame{Error: asError(err)})
	default:
		_ = emit(execFrame{Result: &res})
	}
}

func (h *handler) launch(w http.ResponseWriter, r *http.Request) {
	var req LaunchRequest
	if !decode(w, r, &req) {
		return
	}
	st, err := h.c.Launch(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (h *handler) launchStatus(w http.ResponseWriter, r *http.Request) {
	var f Fence
	if !decode(w, r, &f) {
		return
	}
	st, err := h.c.LaunchStatus(r.Context(), f)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (h *handler) writeFile(w http.ResponseWriter, r *http.Request) {
	body := bufio.NewReaderSize(r.Body, 64<<10)
	line, err := readLine(body, maxHeaderLine)
	if err != nil {
		writeError(w, Errorf(CodeInvalid, "the write's header line: "+err.Error()))
		return
	}
	var req WriteRequest
	d := json.NewDecoder(bytes.NewReader(line))
	d.DisallowUnknownFields()
	if err := d.Decode(&req); err != nil {
		writeError(w, Errorf(CodeInvalid, "the write's header line: "+err.Error()))
		return
	}
	fi, err := h.c.WriteFile(r.Context(), req, &deframer{r: body})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fi)
}

func (h *handler) readFile(w http.ResponseWriter, r *http.Request) {
	var req ReadRequest
	if !decode(w, r, &req) {
		return
	}
	rc, size, err := h.c.ReadFile(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(size, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.CopyN(w, rc, size) // a short copy breaks the connection: the client sees it
}

// fill reads r into b until b is full (err nil) or r reports an error:
// io.EOF, returned as it is, is the content's clean end; anything else —
// io.ErrUnexpectedEOF from a body cut short included — is a failure. Unlike
// io.ReadFull it never turns an end into success or a failure into an
// end.
func fill(r io.Reader, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := r.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

// deframer reads a file write's content from its frames. Its io.EOF is
// the end frame's, and only when the body ends right after it; a body
// that ends before the end frame, or a frame out of bounds, is an error
// (ErrInvalid), so the write aborts and nothing is written.
type deframer struct {
	r    *bufio.Reader
	left int  // bytes of the current frame not yet read
	end  bool // the end frame was read
}

func (d *deframer) Read(p []byte) (int, error) {
	for d.left == 0 {
		if d.end {
			return 0, io.EOF
		}
		var h [frameHeader]byte
		if _, err := io.ReadFull(d.r, h[:]); err != nil {
			return 0, cutShort(err)
		}
		switch n := binary.BigEndian.Uint32(h[:]); {
		case n > maxFrame:
			return 0, Errorf(CodeInvalid, fmt.Sprintf("a content frame of %d bytes is longer than %d; nothing was written", n, maxFrame))
		case n == 0:
			if _, err := d.r.Peek(1); err != io.EOF { //nolint:errorlint // the body's own end
				return 0, Errorf(CodeInvalid, "the body goes on after the content's end frame; nothing was written")
			}
			d.end = true
		default:
			d.left = int(n)
		}
	}
	n, err := d.r.Read(p[:min(len(p), d.left)])
	d.left -= n
	if err != nil {
		return n, cutShort(err)
	}
	return n, nil
}

// cutShort is the error of a write's body that ended, or failed, before
// its end frame.
func cutShort(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF { //nolint:errorlint // the body's own end
		return Errorf(CodeInvalid, "the content ended before its end frame; nothing was written")
	}
	return err
}

// readLine reads one '\n'-terminated line of at most limit bytes (the
// newline excluded).
func readLine(r *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := r.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > limit+1 {
			return nil, fmt.Errorf("longer than %d bytes", limit)
		}
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(line) > 0:
			return nil, io.ErrUnexpectedEOF
		default:
			return nil, err
		}
	}
}
