package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/store"
)

// Webhook deliveries (CONTRACT §16): the log's events, per endpoint, with
// their attempts.

// EnqueueDeliveries implements store.Store.
func (s *Store) EnqueueDeliveries(ctx context.Context, p store.DeliveryEnqueue) (int, error) {
	if p.Endpoint == "" || p.TenantID == "" || p.Limit < 1 {
		return 0, errcode.New(errcode.InvalidRequest, "delivery parameters are incomplete")
	}
	var n int
	err := s.inTx(ctx, func(tx txn) error {
		n = 0
		if _, err := tx.exec(ctx, s.q.cursorInit, p.Endpoint, int64(p.Start)); err != nil {
			return err
		}
		var after int64
		if err := tx.row(ctx, s.q.cursorGet, p.Endpoint).Scan(&after); err != nil {
			return err
		}
		rows, err := tx.rows(ctx, s.q.eventsAfter, after, p.Limit)
		if err != nil {
			return err
		}
		var evs []store.Event
		for rows.Next() {
			e, err := scanEvent(rows)
			if err != nil {
				rows.Close()
				return err
			}
			evs = append(evs, e)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		if len(evs) == 0 {
			return nil
		}
		for _, e := range evs {
			if e.TenantID != p.TenantID || !typeSelected(e.Type, p.Types) {
				continue
			}
			k, err := affected(tx.exec(ctx, s.q.deliveryInsert, p.Endpoint, int64(e.ID), e.TenantID, us(p.Now), us(p.Now), us(p.Now)))
			if err != nil {
				return err
			}
			n += int(k)
		}
		_, err = tx.exec(ctx, s.q.cursorSet, int64(evs[len(evs)-1].ID), p.Endpoint)
		return err
	})
	return n, s.fail(ctx, "enqueue deliveries", err)
}

func typeSelected(typ string, prefixes []string) bool {
	if len(prefixes) == 0 {
		return true
	}
	for _, p := range prefixes {
		if strings.HasPrefix(typ, p) {
			return true
		}
	}
	return false
}

// LeaseDeliveries implements store.Store.
func (s *Store) LeaseDeliveries(ctx context.Context, p store.DeliveryLease) ([]store.Delivery, error) {
	if p.Owner == "" || p.Limit < 1 || !p.Until.After(p.Now) {
		return nil, errcode.New(errcode.InvalidRequest, "delivery lease parameters are incomplete")
	}
	var out []store.Delivery
	err := s.inTx(ctx, func(tx txn) error {
		out = nil
		rows, err := tx.rows(ctx, s.q.deliveryDue, us(p.Now), us(p.Now), p.Limit)
		if err != nil {
			return err
		}
		type key struct {
			endpoint string
			id       int64
		}
		var due []key
		for rows.Next() {
			var k key
			if err := rows.Scan(&k.endpoint, &k.id); err != nil {
				rows.Close()
				return err
			}
			due = append(due, k)
		}
		if err := errors.Join(rows.Err(), rows.Close()); err != nil {
			return err
		}
		for _, k := range due {
			n, err := affected(tx.exec(ctx, s.q.deliveryLock, p.Owner, us(p.Until), k.endpoint, k.id, us(p.Now)))
			if err != nil {
				return err
			}
			if n != 1 {
				continue // another deliverer took it meanwhile
			}
			d, err := s.delivery(ctx, tx, k.endpoint, k.id)
			if err != nil {
				return err
			}
			e, err := scanEvent(tx.row(ctx, s.q.eventByID, k.id))
			switch {
			case errors.Is(err, sql.ErrNoRows): // pruned before delivery
			case err != nil:
				return err
			default:
				d.Event = &e
			}
			out = append(out, d)
		}
		return nil
	})
	return out, s.fail(ctx, "lease deliveries", err)
}

const deliveryCols = `endpoint, event_id, tenant_id, status, attempts, next_us, last_status, last_error, created_us, updated_us`

func scanDelivery(sc scanner) (store.Delivery, error) {
	var d store.Delivery
	var id, next, created, updated int64
	if err := sc.Scan(&d.Endpoint, &id, &d.TenantID, &d.Status, &d.Attempts, &next, &d.LastStatus, &d.LastError,
		&created, &updated); err != nil {
		return d, err
	}
	d.EventID, d.NextAt, d.CreatedAt, d.UpdatedAt = uint64(id), fromUS(next), fromUS(created), fromUS(updated)
	return d, nil
}

func (s *Store) delivery(ctx context.Context, tx txn, endpoint string, id int64) (store.Delivery, error) {
	return scanDelivery(tx.query(ctx, s.q.rebind(`SELECT `+deliveryCols+` FROM webhook_deliveries WHERE endpoint = ? AND event_id = ?`),
		endpoint, id))
}

// FinishDelivery implements store.Store.
func (s *Store) FinishDelivery(ctx context.Context, p store.DeliveryOutcome) error {
	switch p.Status {
	case store.DeliveryPending, store.DeliveryDelivered, store.DeliveryFailed:
	default:
		return errcode.New(errcode.InvalidRequest, "delivery status must be pending, delivered or failed")
	}
	next := p.Next
	if p.Status != store.DeliveryPending {
		next = p.Now
	}
	n, err := affected(s.w.exec(ctx, s.q.deliveryFinish, p.Status, us(next), p.HTTPStatus, p.Error, us(p.Now),
		p.Endpoint, int64(p.EventID), p.Owner))
	if err != nil {
		return s.fail(ctx, "finish delivery", err)
	}
	if n != 1 {
		return errcode.New(errcode.Conflict, "the delivery is no longer leased by this deliverer")
	}
	return nil
}

// Deliveries implements store.Store.
func (s *Store) Deliveries(ctx context.Context, q store.DeliveryQuery) ([]store.Delivery, error) {
	if q.Limit < 1 {
		return nil, errcode.New(errcode.InvalidRequest, "delivery query parameters are incomplete")
	}
	var b strings.Builder
	b.WriteString(`SELECT ` + deliveryCols + ` FROM webhook_deliveries WHERE event_id > ?`)
	args := []any{int64(q.After)}
	if q.TenantID != "" {
		b.WriteString(` AND tenant_id = ?`)
		args = append(args, q.TenantID)
	}
	if q.Status != "" {
		b.WriteString(` AND status = ?`)
		args = append(args, q.Status)
	}
	b.WriteString(` ORDER BY event_id, endpoint LIMIT ?`)
	args = append(args, q.Limit)
	rows, err := s.r.db.QueryxContext(ctx, s.r.db.Rebind(b.String()), args...)
	if err != nil {
		return nil, s.fail(ctx, "deliveries", err)
	}
	defer rows.Close()
	out := []store.Delivery{}
	for rows.Next() {
		d, err := scanDelivery(rows)
		if err != nil {
			return nil, s.fail(ctx, "deliveries", err)
		}
		out = append(out, d)
	}
	return out, s.fail(ctx, "deliveries", rows.Err())
}

// DeliveryCounts implements store.Store.
func (s *Store) DeliveryCounts(ctx context.Context) (map[string]map[string]int, error) {
	var rows []struct {
		Endpoint string
		Status   string
		N        int
	}
	if err := s.r.all(ctx, &rows, s.q.dCounts); err != nil {
		return nil, s.fail(ctx, "delivery counts", err)
	}
	out := map[string]map[string]int{}
	for _, r := range rows {
		if out[r.Endpoint] == nil {
			out[r.Endpoint] = map[string]int{}
		}
		out[r.Endpoint][r.Status] = r.N
	}
	return out, nil
}
