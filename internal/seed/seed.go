// Package seed writes fixture cells straight into a store's database, in
// the shape Prepare writes them: the large inventories of the benchmarks
// and the reliability harness, far faster than preparing 100,000 cells one
// by one.
package seed

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jmoiron/sqlx"

	"github.com/sandboxwich/sandboxwich/lease"
)

// Cells describes the cells to write.
type Cells struct {
	TenantID, WorkerID string
	// Release is the cells' release; its signature is stored as is.
	Release lease.Release
	// Ready cells are claimable until an hour after Now; Terminal ones are
	// quarantined history rows, retired at their creation.
	Ready, Terminal int
	Now             time.Time
}

// Write inserts c's cells, terminal ones first, in one transaction on db,
// whose bind type (sqlx.QUESTION, sqlx.DOLLAR) is bind.
func Write(ctx context.Context, db *sql.DB, bind int, c Cells) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	now := c.Now.UTC()
	const batch = 400 // 13 parameters a row, under SQLite's limit
	add := func(n int, state lease.State) error {
		for done := 0; done < n; done += batch {
			k := min(batch, n-done)
			var sb strings.Builder
			sb.WriteString(`INSERT INTO cells (id, tenant_id, worker_id, provider_cell_id, state, generation, release_set_id,
				runtime_class, policy_digest, release_signature, ready_deadline_us, created_us, updated_us, retired_us) VALUES `)
			args := make([]any, 0, k*13)
			for i := range k {
				if i > 0 {
					sb.WriteString(", ")
				}
				sb.WriteString("(?, ?, ?, ?, ?, 1, ?, ?, ?, ?, ?, ?, ?, ?)")
				id := uuid.Must(uuid.NewV7()).String()
				created := now.Add(time.Duration(done+i) * time.Microsecond).UnixMicro()
				var retired any // NULL while live
				if state != lease.Ready {
					retired = created
				}
				args = append(args, id, c.TenantID, c.WorkerID, "p-"+id, string(state), c.Release.ReleaseSetID,
					string(c.Release.RuntimeClass), c.Release.PolicyDigest, c.Release.Signature, now.Add(time.Hour).UnixMicro(),
					created, created, retired)
			}
			if _, err := tx.ExecContext(ctx, sqlx.Rebind(bind, sb.String()), args...); err != nil {
				return err
			}
		}
		return nil
	}
	if err := add(c.Terminal, lease.Quarantined); err != nil {
		return err
	}
	if err := add(c.Ready, lease.Ready); err != nil {
		return err
	}
	return tx.Commit()
}
