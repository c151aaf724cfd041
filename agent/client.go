package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// Client speaks the protocol over HTTP to a Handler, on connections that
// dial opens (a driver's channel to one cell: a Unix socket, a TLS
// connection). It implements Conn. A refusal of the agent is an *Error;
// a failure to reach it or a broken answer is any other error
// (IsAnswer false): the answer is then unknown.
type Client struct {
	hc *http.Client
}

var _ Conn = (*Client)(nil)

// NewClient returns a Client whose connections dial opens.
func NewClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	tr := &http.Transport{
		DialContext:        func(ctx context.Context, _, _ string) (net.Conn, error) { return dial(ctx) },
		DisableCompression: true,
		// Requests are written through a buffer this large, so an upload
		// whose source yields small reads (a multipart part gives 4 KiB at
		// a time) still crosses into the cell in large writes: each write
		// and wake-up costs more inside gVisor than on the host.
		WriteBufferSize:     256 << 10,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	return &Client{hc: &http.Client{Transport: tr}}
}

// NewClientTransport returns a Client whose requests rt carries: a
// driver whose channel is itself HTTP (a bridge in front of the cell, as
// for Cloudflare) maps the agent's routes onto it there. The requests it
// receives name the host "agent" and the routes of the HTTP form above.
func NewClientTransport(rt http.RoundTripper) *Client {
	return &Client{hc: &http.Client{Transport: rt}}
}

// CloseIdleConnections closes the client's idle connections.
func (c *Client) CloseIdleConnections() { c.hc.CloseIdleConnections() }

const base = "http://agent"

// send makes one request; a non-200 answer is its error.
func (c *Client) send(ctx context.Context, method, path, contentType string, body io.Reader) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		return nil, fmt.Errorf("cell agent: %w", err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cell agent: %s %s: %w", method, path, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		return nil, answerError(resp)
	}
	return resp, nil
}

// answerError reads a refusal: an *Error for a protocol code, any other
// error otherwise.
func answerError(resp *http.Response) error {
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	if err != nil {
		return fmt.Errorf("cell agent: HTTP %d: reading the answer: %w", resp.StatusCode, err)
	}
	var e Error
	if json.Unmarshal(b, &e) != nil || !knownCode(e.Code) {
		return fmt.Errorf("cell agent: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(b))
	}
	return &e
}

// frameError is an error frame as an error.
func frameError(e *Error) error {
	if !knownCode(e.Code) {
		return fmt.Errorf("cell agent: %s: %s", e.Code, e.Message)
	}
	return e
}

// call posts in as JSON (GET when in is nil) and decodes the answer into
// out.
func (c *Client) call(ctx context.Context, path string, in, out any) error {
	method, ctype := http.MethodGet, ""
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("cell agent: %w", err)
		}
		method, ctype, body = http.MethodPost, "application/json", bytes.NewReader(b)
	}
	resp, err := c.send(ctx, method, path, ctype, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxJSONBody)).Decode(out); err != nil {
		return fmt.Errorf("cell agent: %s: reading the answer: %w", path, err)
	}
	return nil
}

// Status reports the agent's state.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var st Status
	err := c.call(ctx, "/v1/status", nil, &st)
	return st, err
}

// Activate binds the agent to a's fence, or replays it.
func (c *Client) Activate(ctx context.Context, a Activation) error {
	var ok map[string]bool
	return c.call(ctx, "/v1/activate", a, &ok)
}

// Release ends the agent bound to f.
func (c *Client) Release(ctx context.Context, f Fence) error {
	var ok map[string]bool
	return c.call(ctx, "/v1/release", f, &ok)
}

// Launch starts the lease's resident process, or reports it on replay.
func (c *Client) Launch(ctx context.Context, req LaunchRequest) (LaunchStatus, error) {
	var st LaunchStatus
	err := c.call(ctx, "/v1/launch", req, &st)
	return st, err
}

// LaunchStatus reports the launched process.
func (c *Client) LaunchStatus(ctx context.Context, f Fence) (LaunchStatus, error) {
	var st LaunchStatus
	err := c.call(ctx, "/v1/launch/status", f, &st)
	return st, err
}

// Exec runs one command. With a non-nil out the output is streamed to out
// as the agent sends it; an error from out ends the request, which stops
// the command.
func (c *Client) Exec(ctx context.Context, req ExecRequest, out func(Output) error) (ExecResult, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return ExecResult{}, fmt.Errorf("cell agent: %w", err)
	}
	path := "/v1/exec"
	if out == nil {
		path += "?collect=1"
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the request, and so the command, when out fails
	resp, err := c.send(ctx, http.MethodPost, path, "application/json", bytes.NewReader(b))
	if err != nil {
		return ExecResult{}, err
	}
	defer resp.Body.Close()
	maxOut := req.MaxOutput
	if maxOut <= 0 {
		maxOut = DefaultMaxOutput
	}
	// A frame is one chunk of output, or the result with at most maxOut
	// bytes of each stream, base64-encoded.
	limit := 2*(maxOut/3+1)*4 + 64<<10
	r := bufio.NewReaderSize(resp.Body, 64<<10)
	for {
		line, err := readLine(r, limit)
		if err != nil {
			return ExecResult{}, fmt.Errorf("cell agent: exec: the answer ended without a result: %w", err)
		}
		var f execFrame
		if err := json.Unmarshal(line, &f); err != nil {
			return ExecResult{}, fmt.Errorf("cell agent: exec: bad frame: %w", err)
		}
		switch {
		case f.Result != nil:
			return *f.Result, nil
		case f.Error != nil:
			return ExecResult{}, frameError(f.Error)
		case out != nil && f.Stream != "":
			if err := out(Output{Stream: f.Stream, Data: f.Data}); err != nil {
				return ExecResult{}, err
			}
		}
	}
}

// WriteFile streams a header line and then content to the agent, in
// frames (see the files/write route); content is never held whole in
// memory. Only when content ends with io.EOF is the end frame sent; any
// other error of content aborts the request, and the agent writes nothing.
func (c *Client) WriteFile(ctx context.Context, req WriteRequest, content io.Reader) (FileInfo, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return FileInfo{}, fmt.Errorf("cell agent: %w", err)
	}
	body := io.MultiReader(bytes.NewReader(append(b, '\n')), &framed{r: content})
	resp, err := c.send(ctx, http.MethodPost, "/v1/files/write", "application/octet-stream", body)
	if err != nil {
		return FileInfo{}, err
	}
	defer resp.Body.Close()
	var fi FileInfo
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxErrorBody)).Decode(&fi); err != nil {
		return FileInfo{}, fmt.Errorf("cell agent: files/write: reading the answer: %w", err)
	}
	return fi, nil
}

// ReadFile returns the file's content as the agent streams it, and its
// size. A short body is an error from the reader (io.ErrUnexpectedEOF).
func (c *Client) ReadFile(ctx context.Context, req ReadRequest) (io.ReadCloser, int64, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, 0, fmt.Errorf("cell agent: %w", err)
	}
	resp, err := c.send(ctx, http.MethodPost, "/v1/files/read", "application/json", bytes.NewReader(b))
	if err != nil {
		return nil, 0, err
	}
	if resp.ContentLength < 0 {
		resp.Body.Close()
		return nil, 0, fmt.Errorf("cell agent: files/read: the answer has no Content-Length")
	}
	return resp.Body, resp.ContentLength, nil
}

// uploadChunk is the size of the writes an upload makes on the channel.
const uploadChunk = 256 << 10

// framed encodes its reader's bytes as a write's content frames: each
// frame is its length (4 bytes, big-endian) and up to uploadChunk bytes,
// and a frame of length 0 ends the content once the reader ended with
// io.EOF. Any other error, io.ErrUnexpectedEOF included, is passed on
// with no end frame, so the request is aborted and the agent writes
// nothing — also through a relay that would turn an aborted request body
// into a clean end (the Cloudflare bridge). Whole chunks, whatever the
// sizes of the reads that produce them (a multipart part yields 4 KiB at
// a time), because each write and wake-up costs more inside gVisor than
// on the host: fewer, larger writes make an upload several times faster.
type framed struct {
	r    io.Reader
	buf  []byte // a data frame and room for the end frame after it
	out  []byte // what is left to hand out of buf
	done bool   // the end frame is in out
}

// next fills out with the next frame, or the last one and the end frame.
func (f *framed) next() error {
	if f.buf == nil {
		f.buf = make([]byte, 2*frameHeader+uploadChunk)
	}
	n, err := fill(f.r, f.buf[frameHeader:frameHeader+uploadChunk])
	if err != nil && err != io.EOF { //nolint:errorlint // only the reader's own EOF is the end
		return err
	}
	binary.BigEndian.PutUint32(f.buf, uint32(n))
	f.out = f.buf[:frameHeader+n]
	if n == 0 {
		f.out = f.buf[:frameHeader] // length 0: the end frame
		f.done = true
	} else if err == io.EOF { //nolint:errorlint // see above
		f.out = append(f.out, 0, 0, 0, 0) // the end frame, in buf's spare room
		f.done = true
	}
	return nil
}

func (f *framed) Read(p []byte) (int, error) {
	if len(f.out) == 0 {
		if f.done {
			return 0, io.EOF
		}
		if err := f.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}

// WriteTo is what io.Copy, and so the HTTP transport, uses: one write a
// frame.
func (f *framed) WriteTo(w io.Writer) (int64, error) {
	var total int64
	for {
		if len(f.out) == 0 {
			if f.done {
				return total, nil
			}
			if err := f.next(); err != nil {
				return total, err
			}
		}
		n, err := w.Write(f.out)
		total += int64(n)
		f.out = f.out[n:]
		if err != nil {
			return total, err
		}
	}
}
