package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/store"
)

// The log itself is written by the triggers of migration 5, in the
// transaction of every statement that changes a state; this file only reads
// and prunes it.

const eventCols = `id, type, at_us, tenant_id, pool_name, cell_id, lease_id, member_id, generation,
	from_state, to_state, disposition, provider_absent, reason`

var errEventsExpired = errcode.New(errcode.EventsExpired,
	"events after this id are older than the log's retention; resynchronise from state")

// Events implements store.Store. It reads the events first and the pruning
// mark second: a prune that committed before the read is seen by the mark,
// so a reader behind it is told, never handed a log with a hole.
func (s *Store) Events(ctx context.Context, q store.EventQuery) ([]store.Event, error) {
	if q.Limit < 1 {
		return nil, errcode.New(errcode.InvalidRequest, "event query parameters are incomplete")
	}
	var b strings.Builder
	b.WriteString(`SELECT ` + eventCols + ` FROM events WHERE id > ?`)
	args := []any{int64(q.After)}
	if q.Oldest {
		args[0] = int64(0)
	}
	if q.TenantID != "" {
		b.WriteString(` AND tenant_id = ?`)
		args = append(args, q.TenantID)
	}
	if !q.Members {
		b.WriteString(` AND type NOT LIKE 'member.%'`)
	}
	if q.TypePrefix != "" {
		b.WriteString(` AND substr(type, 1, ?) = ?`)
		args = append(args, len(q.TypePrefix), q.TypePrefix)
	}
	if q.Pool != "" {
		b.WriteString(` AND pool_name = ?`)
		args = append(args, q.Pool)
	}
	if q.LeaseID != uuid.Nil {
		b.WriteString(` AND lease_id = ?`)
		args = append(args, q.LeaseID.String())
	}
	b.WriteString(` ORDER BY id LIMIT ?`)
	args = append(args, q.Limit)
	rows, err := s.r.db.QueryxContext(ctx, s.r.db.Rebind(b.String()), args...)
	if err != nil {
		return nil, s.fail(ctx, "events", err)
	}
	defer rows.Close()
	out := []store.Event{}
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, s.fail(ctx, "events", err)
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, s.fail(ctx, "events", err)
	}
	var through int64
	if err := s.r.row(ctx, s.q.eventsPruned).Scan(&through); err != nil {
		return nil, s.fail(ctx, "events", err)
	}
	if !q.Oldest && int64(q.After) < through {
		return nil, errEventsExpired
	}
	return out, nil
}

func scanEvent(sc scanner) (store.Event, error) {
	var (
		id, at                                               int64
		typ, tenant, cell                                    string
		pool, leaseID, member, from, to, disposition, reason sql.NullString
		generation                                           sql.NullInt64
		absent                                               bool
	)
	if err := sc.Scan(&id, &typ, &at, &tenant, &pool, &cell, &leaseID, &member, &generation,
		&from, &to, &disposition, &absent, &reason); err != nil {
		return store.Event{}, err
	}
	e := store.Event{ID: uint64(id), Type: typ, At: fromUS(at), TenantID: tenant, Pool: pool.String,
		Generation: uint64(generation.Int64), From: from.String, To: to.String,
		Disposition: lease.Disposition(disposition.String), ProviderAbsent: absent, Reason: reason.String}
	var err error
	if e.CellID, err = uuid.Parse(cell); err != nil {
		return e, fmt.Errorf("event %d cell id: %w", id, err)
	}
	for _, f := range []struct {
		v   sql.NullString
		dst *uuid.UUID
	}{{leaseID, &e.LeaseID}, {member, &e.MemberID}} {
		if f.v.Valid {
			if *f.dst, err = uuid.Parse(f.v.String); err != nil {
				return e, fmt.Errorf("event %d: %w", id, err)
			}
		}
	}
	return e, nil
}

// LastEventID implements store.Store.
func (s *Store) LastEventID(ctx context.Context) (uint64, error) {
	var id int64
	if err := s.r.row(ctx, s.q.lastEvent).Scan(&id); err != nil {
		return 0, s.fail(ctx, "last event", err)
	}
	return uint64(id), nil
}

// PruneEvents implements store.Store: one transaction deletes a prefix of
// the log and raises the pruning mark to its end. It never touches what
// appends lock (Postgres: the advisory lock of the log), so appends do not
// wait for it.
func (s *Store) PruneEvents(ctx context.Context, before time.Time) (int, error) {
	var n int64
	err := s.inTx(ctx, func(tx txn) error {
		n = 0
		var last, kept int64
		if err := tx.row(ctx, s.q.lastEvent).Scan(&last); err != nil {
			return err
		}
		switch err := tx.row(ctx, s.q.firstKept, us(before)).Scan(&kept); {
		case errors.Is(err, sql.ErrNoRows):
			kept = last // every event is old: keep the newest
		case err != nil:
			return err
		}
		cut := kept - 1
		if cut <= 0 {
			return nil
		}
		var err error
		if n, err = affected(tx.exec(ctx, s.q.pruneEvents, cut)); err != nil {
			return err
		}
		if _, err := tx.exec(ctx, s.q.pruneDeliveries, cut); err != nil {
			return err
		}
		_, err = tx.exec(ctx, s.q.pruneMark, cut, cut)
		return err
	})
	return int(n), s.fail(ctx, "prune events", err)
}
