package httpapi

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// countingWriter is an http.ResponseWriter (and Flusher) that keeps what is
// written and counts the writes.
type countingWriter struct {
	hd     http.Header
	body   bytes.Buffer
	writes int
}

func (w *countingWriter) Header() http.Header { return w.hd }
func (w *countingWriter) WriteHeader(int)     {}
func (w *countingWriter) Flush()              {}
func (w *countingWriter) Write(b []byte) (int, error) {
	w.writes++
	return w.body.Write(b)
}

// testFrames returns n frames of about 250 bytes and their bytes in order.
func testFrames(n int) ([][]byte, *bytes.Buffer) {
	var frames [][]byte
	var all bytes.Buffer
	for i := range n {
		f := fmt.Appendf(nil, "id: %d\nevent: cell.leased\ndata: {\"id\":\"%d\",\"pad\":\"%0200d\"}\n\n", i, i, i)
		frames = append(frames, f)
		all.Write(f)
	}
	return frames, &all
}

// TestStreamJoinsFrames: a batch of frames reaches the response in order
// and whole, in writes of about writeChunk — not one write per frame,
// which is a chunk and a system call each.
func TestStreamJoinsFrames(t *testing.T) {
	w := &countingWriter{hd: http.Header{}}
	s := newEventStream(w, time.Hour)
	frames, want := testFrames(3000)
	if err := s.sendFrames(frames); err != nil {
		t.Fatal(err)
	}
	s.stop()
	if !bytes.Equal(w.body.Bytes(), want.Bytes()) {
		t.Fatalf("the stream's bytes differ from its frames in order (%d bytes, want %d)", w.body.Len(), want.Len())
	}
	if max := want.Len()/(writeChunk/2) + 1; w.writes > max {
		t.Fatalf("%d frames (%d bytes) took %d writes, want at most %d", len(frames), want.Len(), w.writes, max)
	}
}

// countingListener counts the writes to the connections it accepts.
type countingListener struct {
	net.Listener
	writes *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	return countingConn{c, l.writes}, err
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// TestStreamWritesOncePerChunk: over HTTP/1.1 a stream's joined frames
// reach the connection in one write each, and the reader gets them whole
// up to the connection's close — not chunked, where each write was a
// first 4 KiB, the rest and a CRLF: three system calls.
func TestStreamWritesOncePerChunk(t *testing.T) {
	frames, want := testFrames(1000)
	var writes atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var before atomic.Int64
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		s := newEventStream(w, time.Hour)
		if err := s.commit(); err != nil {
			t.Error(err)
		}
		before.Store(writes.Load()) // the status line and headers
		if err := s.sendFrames(frames); err != nil {
			t.Error(err)
		}
		s.stop()
	})}
	go srv.Serve(countingListener{ln, &writes})
	defer srv.Close()
	resp, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(body, want.Bytes()) || len(resp.TransferEncoding) != 0 {
		t.Fatalf("the stream's body (%d bytes, transfer encoding %v) differs from its frames (%d bytes)",
			len(body), resp.TransferEncoding, want.Len())
	}
	chunks := int64(want.Len()/writeChunk + 1)
	if got := writes.Load() - before.Load(); got > chunks {
		t.Fatalf("%d bytes of frames took %d writes to the connection, want at most %d", want.Len(), got, chunks)
	}
}
