package httpapi

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/wire"
)

// WorkerTokenPrefix starts every worker bearer token.
const WorkerTokenPrefix = "sbw_wtok_"

// kind is the class of a principal.
type kind int

const (
	kindTenant kind = iota + 1
	kindOperator
	kindWorker
)

// principal is the authenticated caller.
type principal struct {
	kind   kind
	tenant string
	worker *sandboxwich.Worker // set for kindWorker
}

// tokenEntry is one configured bearer token, kept only as its digest.
type tokenEntry struct {
	digest [sha256.Size]byte
	tenant string
	worker *sandboxwich.Worker
}

// authenticator resolves bearer tokens to principals in constant time.
type authenticator struct {
	entries       []tokenEntry
	operator      [sha256.Size]byte
	hasOperator   bool
	defaultTenant string
	insecure      bool
}

func newAuthenticator(a Auth) (*authenticator, error) {
	au := &authenticator{defaultTenant: a.DefaultTenant, insecure: a.AllowInsecureNoAuth}
	if au.defaultTenant == "" {
		au.defaultTenant = "default"
	}
	seen := map[[sha256.Size]byte]bool{}
	add := func(e tokenEntry, what string) error {
		if seen[e.digest] {
			return fmt.Errorf("httpapi: a %s token is configured more than once", what)
		}
		seen[e.digest] = true
		au.entries = append(au.entries, e)
		return nil
	}
	for tok, tenant := range a.TenantTokens {
		if err := checkTenantToken(tok, tenant); err != nil {
			return nil, err
		}
		if err := add(tokenEntry{digest: sha256.Sum256([]byte(tok)), tenant: tenant}, "tenant"); err != nil {
			return nil, err
		}
	}
	if a.SharedToken != "" {
		if err := checkTenantToken(a.SharedToken, au.defaultTenant); err != nil {
			return nil, err
		}
		if err := add(tokenEntry{digest: sha256.Sum256([]byte(a.SharedToken)), tenant: au.defaultTenant}, "shared"); err != nil {
			return nil, err
		}
	}
	for tok, w := range a.Workers {
		if err := checkWorker(tok, w); err != nil {
			return nil, err
		}
		if err := add(tokenEntry{digest: sha256.Sum256([]byte(tok)), tenant: w.TenantID, worker: &w}, "worker"); err != nil {
			return nil, err
		}
	}
	if a.OperatorToken != "" {
		if strings.TrimSpace(a.OperatorToken) != a.OperatorToken {
			return nil, errors.New("httpapi: the operator token has surrounding white space")
		}
		au.operator, au.hasOperator = sha256.Sum256([]byte(a.OperatorToken)), true
		if seen[au.operator] {
			// The operator header would be a bearer token too: whoever
			// holds it could act as that principal, and the reverse.
			return nil, errors.New("httpapi: the operator token equals a tenant, shared or worker token")
		}
	}
	return au, nil
}

func checkTenantToken(tok, tenant string) error {
	switch {
	case strings.TrimSpace(tok) == "":
		return errors.New("httpapi: a tenant token is empty")
	case strings.TrimSpace(tok) != tok || strings.ContainsAny(tok, " \t"):
		return errors.New("httpapi: a tenant token contains white space")
	case strings.HasPrefix(tok, WorkerTokenPrefix):
		return errors.New("httpapi: a tenant token starts with the worker token prefix " + WorkerTokenPrefix)
	case tenant == "":
		return errors.New("httpapi: a tenant token maps to an empty tenant")
	}
	return nil
}

func checkWorker(tok string, w sandboxwich.Worker) error {
	switch {
	case !strings.HasPrefix(tok, WorkerTokenPrefix) || len(tok) == len(WorkerTokenPrefix):
		return fmt.Errorf("httpapi: the token of worker %s does not start with %s", w.ID, WorkerTokenPrefix)
	case strings.ContainsAny(tok, " \t\r\n"):
		return fmt.Errorf("httpapi: the token of worker %s contains white space", w.ID)
	case w.ID == uuid.Nil:
		return errors.New("httpapi: a worker has no ID")
	case w.TenantID == "":
		return fmt.Errorf("httpapi: worker %s has no tenant", w.ID)
	}
	return nil
}

// configured reports whether any token mode is configured.
func (au *authenticator) configured() bool { return len(au.entries) > 0 || au.insecure }

// lookup returns the entry of a presented token, comparing its digest with
// every configured digest without an early exit.
func (au *authenticator) lookup(tok string) *tokenEntry {
	d := sha256.Sum256([]byte(tok))
	var found *tokenEntry
	for i := range au.entries {
		if subtle.ConstantTimeCompare(d[:], au.entries[i].digest[:]) == 1 {
			found = &au.entries[i]
		}
	}
	return found
}

// isOperator reports whether the request carries the operator token.
func (au *authenticator) isOperator(r *http.Request) bool {
	v := r.Header.Get(wire.OperatorHeader)
	if !au.hasOperator || v == "" {
		return false
	}
	d := sha256.Sum256([]byte(v))
	return subtle.ConstantTimeCompare(d[:], au.operator[:]) == 1
}

var (
	errNoToken      = errcode.New(errcode.Unauthorized, "a valid bearer token is required")
	errBadToken     = errcode.New(errcode.Unauthorized, "the bearer token is not valid")
	errWrongClass   = errcode.New(errcode.Unauthorized, "this route does not accept this kind of token")
	errNeedOperator = errcode.New(errcode.Unauthorized, "this route requires an operator")
)

// authenticate returns the principal of a request.
func (au *authenticator) authenticate(r *http.Request) (principal, error) {
	values := r.Header.Values("Authorization")
	if len(values) == 0 {
		if au.insecure {
			return au.tenantPrincipal(r, au.defaultTenant), nil
		}
		return principal{}, errNoToken
	}
	tok, ok := bearer(values)
	if !ok {
		return principal{}, errBadToken
	}
	e := au.lookup(tok)
	if e == nil {
		return principal{}, errBadToken
	}
	if e.worker != nil {
		return principal{kind: kindWorker, tenant: e.tenant, worker: e.worker}, nil
	}
	return au.tenantPrincipal(r, e.tenant), nil
}

// tenantPrincipal is a tenant, upgraded to operator by the operator header.
func (au *authenticator) tenantPrincipal(r *http.Request, tenant string) principal {
	if au.isOperator(r) {
		return principal{kind: kindOperator, tenant: tenant}
	}
	return principal{kind: kindTenant, tenant: tenant}
}

// bearer returns the token of a single "Bearer <token>" Authorization
// header (the scheme is case-insensitive).
func bearer(values []string) (string, bool) {
	if len(values) != 1 {
		return "", false
	}
	scheme, tok, ok := strings.Cut(strings.TrimSpace(values[0]), " ")
	tok = strings.TrimSpace(tok)
	if !ok || !strings.EqualFold(scheme, "Bearer") || tok == "" {
		return "", false
	}
	return tok, true
}

// authorize authenticates a request and checks that its principal may use
// the route. A worker's {worker_id} must name the worker itself (else 404).
func (h *handler) authorize(r *http.Request, rt *route) (principal, error) {
	switch rt.access {
	case accessProbe, accessPublic:
		return principal{}, nil
	case accessMetrics:
		if h.public {
			return principal{}, nil
		}
	}
	p, err := h.auth.authenticate(r)
	if err != nil {
		return principal{}, err
	}
	switch rt.access {
	case accessMetrics, accessTenant:
		if p.kind == kindWorker {
			return principal{}, errWrongClass
		}
	case accessOperator:
		if p.kind != kindOperator {
			return principal{}, errNeedOperator
		}
	case accessWorker:
		return p, checkWorkerPath(r, p)
	}
	return p, nil
}

// checkWorkerPath admits only a worker whose ID is the {worker_id} segment.
func checkWorkerPath(r *http.Request, p principal) error {
	if p.kind != kindWorker {
		return errWrongClass
	}
	id, err := pathUUID(r, "worker_id")
	if err != nil {
		return err
	}
	if id != p.worker.ID {
		return errNotFound
	}
	return nil
}
