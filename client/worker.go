package client

import (
	"context"
	"net/http"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/wire"
)

func workerPath(workerID uuid.UUID, suffix string) string {
	return "/workers/" + workerID.String() + "/sterile-cells" + suffix
}

// Prepare registers a ready cell the worker has prepared
// (POST /v1/workers/{worker_id}/sterile-cells/prepare). It is not
// idempotent and never retried: after a lost response, look the cell up with
// [Client.WorkerCell] (a repeat would be refused as a reused cell ID).
func (c *Client) Prepare(ctx context.Context, workerID uuid.UUID, req wire.PrepareRequest) (wire.Cell, error) {
	var resp wire.CellResponse
	err := c.do(ctx, request{method: http.MethodPost, path: workerPath(workerID, "/prepare"), body: req}, &resp)
	return resp.Cell, err
}

// WorkerCell returns one of the worker's cells and the claim that leased it,
// if any (GET /v1/workers/{worker_id}/sterile-cells/{cell_id}).
func (c *Client) WorkerCell(ctx context.Context, workerID, cellID uuid.UUID) (wire.WorkerCellResponse, error) {
	var resp wire.WorkerCellResponse
	err := c.do(ctx, request{method: http.MethodGet, path: workerPath(workerID, "/"+cellID.String()), retry: true}, &resp)
	return resp, err
}

// Retire quarantines one of the worker's ready cells of the given generation
// (POST …/{cell_id}/retire). It is sent once; an exact repeat is answered
// 200 by the server, so the caller may repeat it after a lost response.
func (c *Client) Retire(ctx context.Context, workerID, cellID uuid.UUID, generation uint64) (wire.Cell, error) {
	var resp wire.CellResponse
	body := wire.RetireRequest{Generation: generation}
	err := c.do(ctx, request{method: http.MethodPost, path: workerPath(workerID, "/"+cellID.String()+"/retire"), body: body}, &resp)
	return resp.Cell, err
}

// Destroy ends one of the worker's leased cells with the requested
// disposition once the worker has torn it down (POST …/{cell_id}/destroy).
// A request that does not match the live lease quarantines the cell. It is
// sent once; an exact repeat on the terminal cell is answered 200 unchanged.
func (c *Client) Destroy(ctx context.Context, workerID, cellID uuid.UUID, req wire.DestroyRequest) (wire.Cell, error) {
	var resp wire.CellResponse
	err := c.do(ctx, request{method: http.MethodPost, path: workerPath(workerID, "/"+cellID.String()+"/destroy"), body: req}, &resp)
	return resp.Cell, err
}
