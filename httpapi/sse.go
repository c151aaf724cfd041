package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// eventStream writes a text/event-stream answer: each event flushed as it
// is sent, and a keep-alive comment every interval until stop. The
// response is committed (200 and the stream's headers) by the first event
// or keep-alive, whichever comes first; until then the route can still
// answer an ordinary JSON error instead.
type eventStream struct {
	w  http.ResponseWriter
	rc *http.ResponseController

	mu        sync.Mutex
	committed bool
	err       error // the first write error: the client is gone

	quit chan struct{}
	done chan struct{}
}

// keepAliveComment is the keep-alive line of an event stream.
const keepAliveComment = ": keep-alive\n\n"

// newEventStream starts an event stream on w with a keep-alive comment
// every interval.
func newEventStream(w http.ResponseWriter, interval time.Duration) *eventStream {
	s := &eventStream{w: w, rc: http.NewResponseController(w), quit: make(chan struct{}), done: make(chan struct{})}
	go s.keepAlive(interval)
	return s
}

func (s *eventStream) keepAlive(interval time.Duration) {
	defer close(s.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
			s.mu.Lock()
			err := s.write([]byte(keepAliveComment))
			s.mu.Unlock()
			if err != nil {
				return
			}
		}
	}
}

// stop ends the keep-alive comments and reports whether the response was
// committed. Events can still be sent after it.
func (s *eventStream) stop() (committed bool) {
	close(s.quit)
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.committed
}

// send writes one event whose data is v in JSON, and flushes it.
func (s *eventStream) send(event string, v any) error { return s.sendWith("", event, v) }

// sendWith is send with lines before the event line (an id line).
func (s *eventStream) sendWith(head, event string, v any) error {
	data, err := json.Marshal(v) // one line: JSON has no raw newline
	if err != nil {
		return err
	}
	b := fmt.Appendf(nil, "%sevent: %s\ndata: %s\n\n", head, event, data)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write(b)
}

// commit commits the response without writing an event.
func (s *eventStream) commit() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.write()
}

// write commits the response if needed, writes bs in order and flushes.
// s.mu is held.
func (s *eventStream) write(bs ...[]byte) error {
	if s.err != nil {
		return s.err
	}
	if !s.committed {
		s.committed = true
		hd := s.w.Header()
		hd.Set("Content-Type", "text/event-stream")
		hd.Set("Cache-Control", "no-store")
		hd.Set("X-Accel-Buffering", "no") // ask proxies not to buffer
		// Over HTTP/1.1 the stream is delimited by the connection's close,
		// not chunked, as the Server-Sent Events specification recommends
		// (net/http's "identity" setting; HTTP/2 drops the header). A
		// chunked write cost three system calls — a first 4 KiB, the rest,
		// and the chunk's CRLF at the flush — and a reader three wake-ups;
		// a raw one costs one. A frame is complete only at its blank line,
		// so a cut stream loses no event silently.
		hd.Set("Transfer-Encoding", "identity")
		s.w.WriteHeader(http.StatusOK)
	}
	// Frames go out in writes of up to writeChunk: net/http passes a write
	// that large to the connection whole, where one write per frame would
	// cost a chunk and a system call each (a stream behind by a poll's
	// worth of events sends hundreds at once).
	if len(bs) > 1 {
		bp := chunks.Get().(*[]byte)
		defer chunks.Put(bp)
		buf := (*bp)[:0]
		for i, b := range bs {
			buf = append(buf, b...)
			if i == len(bs)-1 || len(buf)+len(bs[i+1]) > writeChunk {
				if _, s.err = s.w.Write(buf); s.err != nil {
					return s.err
				}
				buf = buf[:0]
			}
		}
		*bp = buf
	} else if len(bs) == 1 {
		if _, s.err = s.w.Write(bs[0]); s.err != nil {
			return s.err
		}
	}
	s.err = s.rc.Flush()
	return s.err
}

// writeChunk bounds one write of a stream's frames.
const writeChunk = 64 << 10

// chunks holds the buffers streams join their frames in.
var chunks = sync.Pool{New: func() any { b := make([]byte, 0, writeChunk); return &b }}
