// Command sandboxwich-agent is the cell agent (CONTRACT §13): the
// credential-free launcher that runs as PID 1 inside every cell and serves
// package agent's protocol (the daemon is package agent/cellagent) on a
// Unix socket the provider's control side dials. It is a static binary of
// the standard library and packages agent and agent/cellagent only:
//
//	CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' ./cmd/sandboxwich-agent
//
// Every cell maps it and it hashes itself at start, so its size is paid per
// cell: -s -w drop the symbol table and DWARF, which nothing in a cell
// reads (stack traces keep their function names and lines).
//
// Usage:
//
//	sandboxwich-agent -listen /run/sandboxwich/agent.sock -cell-id <cell>
//	sandboxwich-agent -listen tcp:0.0.0.0:8080 -cell-id <cell>
//	sandboxwich-agent -listen tcp:0.0.0.0:7443 -cell-id <cell> \
//	    -tls-cert tls.crt -tls-key tls.key -tls-client-ca ca.crt \
//	    -digest sha256:<agent image digest>
//	sandboxwich-agent -install /sbw/bin/sandboxwich-agent
//
// -install copies the running executable to the path (mode 0555, parents
// not created) and exits: the init container of a Kubernetes cell runs it
// from the agent image, which holds nothing else, to put the agent into
// the emptyDir the cell container starts it from.
//
// A -listen value "tcp:<host>:<port>" serves on TCP instead of a Unix
// socket: a provider that reaches its cells only over a port (a
// Cloudflare Container, whose one client is the bridge's Durable Object,
// CONTRACT §18) runs it so.
//
// With -tls-cert, -tls-key and -tls-client-ca (files of a Secret mounted
// read-only: the server leaf, its key and the cell's CA) it serves TLS 1.3
// only on a tcp: listener and requires a client certificate from that CA
// whose only URI SAN is spiffe://sandboxwich/cell/<cell-id>/control
// (agent.ServerTLS): the Kubernetes driver's channel (CONTRACT §13). The
// three go together, and only with tcp:.
//
// Its digest ("sha256:<hex>" of its own executable, read from
// /proc/self/exe at start) is what Status reports, unless -digest names
// the build digest to report instead: a provider that ships the agent in
// an image pinned by digest passes that digest, the one it expects. As PID 1 it reaps every
// orphan of the cell, replaces its stdio with /dev/null (the runtime hands
// an init the host files of whoever created the container), and so logs
// nowhere, and makes itself non-dumpable (no workload can read its /proc
// entries or trace it); SIGTERM (or SIGINT) kills every process of the
// cell and exits.
//
// -record <file> is for tests only: it appends every request the agent
// receives (method, path and the whole body, file content included) to
// the file, so that a test can scan everything the agent was ever sent for
// secrets. Never use it in a deployment.
package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/agent/cellagent"
)

func main() {
	cellagent.HelperMain()
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sandboxwich-agent:", err)
		os.Exit(1)
	}
}

func run() error {
	listen := flag.String("listen", "", "the Unix socket to serve on (a stale one is replaced), or tcp:<host>:<port>")
	cellID := flag.String("cell-id", "", "the cell this agent serves")
	home := flag.String("home", agent.DefaultHome, "the cell user's home")
	record := flag.String("record", "", "TEST ONLY: append every request received to this file")
	tlsCert := flag.String("tls-cert", "", "PEM server certificate (serve TLS 1.3 with client authentication)")
	tlsKey := flag.String("tls-key", "", "PEM key of -tls-cert")
	tlsCA := flag.String("tls-client-ca", "", "PEM CA certificate the client certificate must chain to")
	digestFlag := flag.String("digest", "", "the build digest (sha256:<64 hex>) Status reports; default the executable's")
	install := flag.String("install", "", "copy this executable to the path and exit")
	flag.Parse()
	if *install != "" && flag.NArg() == 0 {
		return installSelf(*install)
	}
	if *listen == "" || *cellID == "" || flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	useTLS := *tlsCert != "" || *tlsKey != "" || *tlsCA != ""
	if useTLS && (*tlsCert == "" || *tlsKey == "" || *tlsCA == "") {
		return errors.New("-tls-cert, -tls-key and -tls-client-ca go together")
	}
	if useTLS && !strings.HasPrefix(*listen, "tcp:") {
		return errors.New("TLS needs a tcp: listener")
	}
	if d := *digestFlag; d != "" && !validDigest(d) {
		return fmt.Errorf("-digest %q is not sha256:<64 hex digits>", d)
	}
	if os.Getpid() == 1 {
		if err := becomeInit(); err != nil {
			return err
		}
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	digest := *digestFlag
	if digest == "" {
		var err error
		if digest, err = selfDigest(); err != nil {
			return err
		}
	}
	a, err := cellagent.New(cellagent.Config{CellID: *cellID, Digest: digest, Home: *home, Logger: log})
	if err != nil {
		return err
	}
	ln, err := listenOn(*listen)
	if err != nil {
		return err
	}
	if useTLS {
		cfg, err := agent.LoadServerTLS(*tlsCert, *tlsKey, *tlsCA, *cellID)
		if err != nil {
			ln.Close()
			return err
		}
		ln = tls.NewListener(ln, cfg)
	}
	h := whenIdle(agent.NewHandler(a), idleRelease, releaseFilePages)
	if *record != "" {
		f, err := os.OpenFile(*record, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		h = recorder(h, f)
	}
	srv := &http.Server{Handler: h}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sig
		log.Info("signal: killing every process of the cell", "signal", s.String())
		a.Shutdown()
		_ = srv.Shutdown(context.Background())
	}()
	log.Info("cell agent serving", "cell_id", *cellID, "digest", digest, "listen", ln.Addr().String(), "tls", useTLS, "pid", os.Getpid())
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// listenOn opens the listener of a -listen value: "tcp:<host>:<port>",
// or the path of a Unix socket, born 0600 (only root connects), replacing
// a stale one.
func listenOn(listen string) (net.Listener, error) {
	if addr, ok := strings.CutPrefix(listen, "tcp:"); ok {
		return net.Listen("tcp", addr)
	}
	if err := os.Remove(listen); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	old := syscall.Umask(0o177)
	ln, err := net.Listen("unix", listen)
	syscall.Umask(old)
	return ln, err
}

// installSelf copies the running executable to dst, mode 0555.
func installSelf(dst string) error {
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	defer src.Close()
	f, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o555)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if _, err := io.Copy(f, src); err != nil {
		f.Close()
		return fmt.Errorf("install: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	return os.Chmod(dst, 0o555)
}

// validDigest reports whether d is "sha256:<64 lower-case hex digits>".
func validDigest(d string) bool {
	h, ok := strings.CutPrefix(d, "sha256:")
	return ok && len(h) == 64 && strings.Trim(h, "0123456789abcdef") == ""
}

// digestReadSize is what selfDigest reads at a time. Under gVisor every
// read is a trip through the sentry: in io.Copy's 32 KiB reads, hashing
// the 9.9 MB agent took 19 ms of a cell's start; in 1 MiB reads, 8.
const digestReadSize = 1 << 20

// selfDigest is "sha256:<hex>" of the running executable. Its buffer is
// an anonymous mapping of its own, unmapped on return, so the idle
// agent's heap does not keep it.
func selfDigest() (string, error) {
	f, err := os.Open("/proc/self/exe")
	if err != nil {
		return "", fmt.Errorf("digest: %w", err)
	}
	defer f.Close()
	buf, err := syscall.Mmap(-1, 0, digestReadSize, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return "", fmt.Errorf("digest: %w", err)
	}
	defer func() { _ = syscall.Munmap(buf) }()
	h := sha256.New()
	// The wrapper hides *os.File's WriteTo, which would read in 32 KiB.
	if _, err := io.CopyBuffer(h, struct{ io.Reader }{f}, buf); err != nil {
		return "", fmt.Errorf("digest: %w", err)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// recorder appends every request to w before h serves it: a line
// "METHOD PATH?QUERY", then the body as h reads it, then a newline. Test
// only (-record).
func recorder(h http.Handler, w io.Writer) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		mu.Lock()
		fmt.Fprintf(w, "%s %s\n", r.Method, r.URL.RequestURI())
		mu.Unlock()
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.TeeReader(r.Body, lockedWriter{&mu, w}), r.Body}
		h.ServeHTTP(rw, r)
		mu.Lock()
		fmt.Fprintln(w)
		mu.Unlock()
	})
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
