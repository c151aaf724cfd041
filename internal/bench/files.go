package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/httpapi"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// FileReport is R8: the throughput of a files/write upload through the
// server, the plane and the cell's agent into the cell's tmpfs, against
// the same upload (the same client, the same multipart body, loopback
// HTTP) into a host tmpfs file by a trivial handler in the same process.
type FileReport struct {
	Bytes    int64   `json:"bytes"`
	CellMiBs float64 `json:"cell_mib_per_s"`
	HostMiBs float64 `json:"host_mib_per_s"`
	Ratio    float64 `json:"ratio"`
}

// fileBytes is the size of one upload.
const fileBytes = 64 << 20

func benchFiles(ctx context.Context, plane *sandboxwich.Plane, rel lease.Release, quick bool) (*FileReport, error) {
	n := 5
	if quick {
		n = 3
	}
	const token = "bench-token"
	h, err := httpapi.New(httpapi.Config{Plane: plane, Auth: httpapi.Auth{TenantTokens: map[string]string{token: benchTenant}},
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	host, err := os.MkdirTemp(hostTmpfs(), "sbw-bench-files-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(host)
	mux := http.NewServeMux()
	mux.Handle("/v1/", h)
	// The baseline answers the cell route's path, so the same client call
	// makes the same request.
	mux.HandleFunc("POST /baseline/v1/sterile-cell-leases/{id}/files/write", func(w http.ResponseWriter, r *http.Request) {
		info, err := trivialUpload(r, host)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(info)
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	defer srv.Close()
	base := "http://" + ln.Addr().String()
	cellClient, err := client.New(base, client.WithToken(token))
	if err != nil {
		return nil, err
	}
	hostClient, err := client.New(base+"/baseline", client.WithToken(token))
	if err != nil {
		return nil, err
	}
	leaseSeconds := uint64(300)
	claim, err := cellClient.Claim(ctx, wire.ClaimRequest{Release: rel, Binding: benchBinding, LeaseSeconds: &leaseSeconds})
	if err != nil || claim.Lease == nil {
		return nil, fmt.Errorf("files: claim: %v", err)
	}
	proof := claim.Proof()
	defer func() {
		_, _ = plane.Release(ctx, benchTenant, claim.Lease.LeaseID, sandboxwich.NewProof(proof.LeaseAttestation, proof.Generation, proof.Binding), lease.Destroyed)
	}()

	content := make([]byte, fileBytes)
	if _, err := rand.Read(content); err != nil {
		return nil, err
	}
	sum := sha256.Sum256(content)
	upload := func(c *client.Client) (time.Duration, error) {
		t0 := time.Now()
		res, err := c.WriteFile(ctx, claim.Lease.LeaseID, proof, client.FileWrite{Path: "/tmp/bench.bin"}, bytes.NewReader(content))
		d := time.Since(t0)
		if err == nil && (res.Size != fileBytes || res.SHA256 != hex.EncodeToString(sum[:])) {
			err = fmt.Errorf("wrote %d bytes, sha256 %s", res.Size, res.SHA256)
		}
		return d, err
	}
	// Turns, so that both see the same machine.
	var cell, hostd []time.Duration
	for range n {
		d, err := upload(cellClient)
		if err != nil {
			return nil, fmt.Errorf("files: into the cell: %w", err)
		}
		cell = append(cell, d)
		if d, err = upload(hostClient); err != nil {
			return nil, fmt.Errorf("files: into the host: %w", err)
		}
		hostd = append(hostd, d)
	}
	rep := &FileReport{Bytes: fileBytes,
		CellMiBs: float64(fileBytes>>20) / (summarize(cell, 0, 0).P50MS / 1000),
		HostMiBs: float64(fileBytes>>20) / (summarize(hostd, 0, 0).P50MS / 1000)}
	rep.Ratio = ratio(rep.CellMiBs, rep.HostMiBs)
	return rep, nil
}

// trivialUpload is the baseline's handler: it skips the proof part and
// copies the content part into a new file under dir, hashing it, as the
// agent does.
func trivialUpload(r *http.Request, dir string) (wire.FileWriteResponse, error) {
	mr, err := r.MultipartReader()
	if err != nil {
		return wire.FileWriteResponse{}, err
	}
	for {
		part, err := mr.NextPart()
		if err != nil {
			return wire.FileWriteResponse{}, err
		}
		if part.FormName() != wire.PartContent {
			continue
		}
		f, err := os.CreateTemp(dir, "upload-")
		if err != nil {
			return wire.FileWriteResponse{}, err
		}
		h := sha256.New()
		n, err := io.Copy(io.MultiWriter(f, h), part)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return wire.FileWriteResponse{OK: true, Path: f.Name(), Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, err
	}
}

// hostTmpfs is a tmpfs of the host: /dev/shm where it exists.
func hostTmpfs() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}
