package main

// The client subcommands: claim, validate, release, lease and pools for
// tenants and operators (exec, cp and launch are in cell_cmds.go;
// inventory, leases, evidence and revoke in lease_cmds.go); prepare, cell,
// retire and destroy for external workers. They talk to a running server
// through package client.
//
// Secrets never travel through argv: the bearer token comes from
// SANDBOXWICH_TOKEN or --token-file, the operator token from
// SANDBOXWICH_OPERATOR_TOKEN or --operator-token-file, and the lease
// attestation only ever lives in the file named by --attestation-file, which
// claim creates (new, mode 0600) and the other commands read. No command
// prints an attestation or a token, with or without --json.

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/attest"
	"github.com/sandboxwich/sandboxwich/client"
	"github.com/sandboxwich/sandboxwich/errcode"
	"github.com/sandboxwich/sandboxwich/lease"
	"github.com/sandboxwich/sandboxwich/wire"
)

// exitCode is the exit status of a command run by `sandboxwich exec`, or 3
// for a claim that found no cell. The message has already been printed (or
// there is none): run() exits with the status and prints nothing.
type exitCode int

func (c exitCode) Error() string { return "exit status " + strconv.Itoa(int(c)) }

// Defaults of the client commands.
const (
	cliDefaultServer  = "http://127.0.0.1:3217"
	cliDefaultTimeout = 60 * time.Second
	// cliEmptyClaim is the exit status of a claim that leased nothing.
	cliEmptyClaim = exitCode(3)
	// cliMaxSecretFile bounds token and attestation files.
	cliMaxSecretFile = 4096
)

// cliFlags are the flags every client command has. A flag whose usage says
// "(required" must be given a value: parse reports every missing one.
type cliFlags struct {
	fs                *flag.FlagSet
	e                 env
	server            string
	tokenFile         string
	operatorTokenFile string
	caFile            string
	json              bool
	timeout           time.Duration
}

func newCLIFlags(e env, name string) *cliFlags {
	f := &cliFlags{fs: newFlags(e, name), e: e}
	f.fs.StringVar(&f.server, "server", cmp.Or(e.getenv("SANDBOXWICH_URL"), cliDefaultServer), "server base URL (env SANDBOXWICH_URL)")
	f.fs.StringVar(&f.tokenFile, "token-file", "", "read the tenant or worker bearer token from this file (default: env SANDBOXWICH_TOKEN)")
	f.fs.StringVar(&f.operatorTokenFile, "operator-token-file", "", "read the operator token from this file (default: env SANDBOXWICH_OPERATOR_TOKEN)")
	f.fs.StringVar(&f.caFile, "ca-file", e.getenv("SANDBOXWICH_CA_FILE"), "PEM CA bundle to trust for an https server (env SANDBOXWICH_CA_FILE)")
	f.fs.BoolVar(&f.json, "json", false, "print the wire JSON object instead of a summary (failures too)")
	f.fs.DurationVar(&f.timeout, "timeout", cliDefaultTimeout, "deadline of the whole command, retries and --wait included")
	return f
}

// parse parses args and checks the required flags; positional arguments
// are refused unless allowed.
func (f *cliFlags) parse(args []string, positional bool) error {
	if err := f.fs.Parse(args); err != nil {
		return err
	}
	if !positional && f.fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected argument %q", errUsage, f.fs.Arg(0))
	}
	return f.required()
}

// required reports, in one error, every required flag without a value.
func (f *cliFlags) required() error {
	var missing []string
	f.fs.VisitAll(func(fl *flag.Flag) {
		if strings.Contains(fl.Usage, "(required") && fl.Value.String() == "" {
			missing = append(missing, "--"+fl.Name)
		}
	})
	switch len(missing) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("%w: missing required flag %s", errUsage, missing[0])
	}
	return fmt.Errorf("%w: missing required flags %s", errUsage, strings.Join(missing, ", "))
}

// set reports whether a flag was given on the command line.
func (f *cliFlags) set(name string) bool {
	found := false
	f.fs.Visit(func(fl *flag.Flag) { found = found || fl.Name == name })
	return found
}

// call makes the command's API call with the client of its flags, under
// --timeout, and adds the hints a user can act on to its error.
func call[T any](ctx context.Context, f *cliFlags, do func(context.Context, *client.Client) (T, error)) (T, error) {
	c, err := f.client()
	if err != nil {
		var zero T
		return zero, err
	}
	if f.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, f.timeout)
		defer cancel()
	}
	v, err := do(ctx, c)
	if errors.Is(err, errcode.ErrUnauthorized) && !f.hasToken() {
		err = fmt.Errorf("%w\nhint: set SANDBOXWICH_TOKEN or pass --token-file", err)
	}
	return v, err
}

// output prints obj with --json, else the aligned key/value lines kv.
func (f *cliFlags) output(obj any, kv []string) error {
	if f.json {
		return cliJSON(f.e.stdout, obj)
	}
	return cliKV(f.e.stdout, kv)
}

// cliKV prints aligned key/value lines.
func cliKV(w io.Writer, kv []string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i := 0; i+1 < len(kv); i += 2 {
		fmt.Fprintf(tw, "%s\t%s\n", kv[i], kv[i+1])
	}
	return tw.Flush()
}

// client builds the API client from the flags and the environment.
func (f *cliFlags) client() (*client.Client, error) { return f.clientWith(nil) }

// clientWith is client, its HTTP transport wrapped by wrap unless nil
// (TLS settings, and redirects only within the server, as the client's
// default).
func (f *cliFlags) clientWith(wrap func(http.RoundTripper) http.RoundTripper, extra ...client.Option) (*client.Client, error) {
	token, err := cliSecret(f.e, f.tokenFile, "SANDBOXWICH_TOKEN", "--token-file")
	if err != nil {
		return nil, err
	}
	op, err := cliSecret(f.e, f.operatorTokenFile, "SANDBOXWICH_OPERATOR_TOKEN", "--operator-token-file")
	if err != nil {
		return nil, err
	}
	opts := []client.Option{client.WithToken(token), client.WithOperatorToken(op)}
	var tlsConfig *tls.Config
	if f.caFile != "" {
		pem, err := os.ReadFile(f.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		roots := x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s holds no PEM certificate", f.caFile)
		}
		opts = append(opts, client.WithTLSConfig(&tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}))
		tlsConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	}
	if wrap != nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = tlsConfig
		opts = append(opts, client.WithHTTPClient(&http.Client{Transport: wrap(tr), CheckRedirect: cliSameOrigin}))
	}
	c, err := client.New(f.server, append(opts, extra...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: --server: %v", errUsage, err)
	}
	return c, nil
}

// cliSameOrigin follows at most 10 redirects, and only those to the scheme
// and host of the original request, as the client's default HTTP client
// does: the operator token never reaches another server.
func cliSameOrigin(req *http.Request, via []*http.Request) error {
	first := via[0].URL
	if len(via) >= 10 || req.URL.Scheme != first.Scheme || req.URL.Host != first.Host {
		return http.ErrUseLastResponse
	}
	return nil
}

// cliSecret reads a secret from file (trimmed) or, without a file, from the
// environment variable.
func cliSecret(e env, file, envName, flagName string) (string, error) {
	if file == "" {
		return strings.TrimSpace(e.getenv(envName)), nil
	}
	s, err := cliReadSecretFile(file)
	if err != nil {
		return "", fmt.Errorf("%s: %w", flagName, err)
	}
	if s == "" {
		return "", fmt.Errorf("%s %s is empty", flagName, file)
	}
	return s, nil
}

// cliReadSecretFile returns the trimmed content of a small file.
func cliReadSecretFile(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, cliMaxSecretFile+1))
	if err != nil {
		return "", err
	}
	if len(b) > cliMaxSecretFile {
		return "", fmt.Errorf("%s is larger than %d bytes", path, cliMaxSecretFile)
	}
	return strings.TrimSpace(string(b)), nil
}

// cliBinding registers the four binding flags.
func cliBinding(fs *flag.FlagSet) *wire.Binding {
	b := &wire.Binding{}
	fs.StringVar(&b.OrganizationID, "org", "", "organization_id the lease is bound to (required)")
	fs.StringVar(&b.WorkspaceID, "workspace", "", "workspace_id (required)")
	fs.StringVar(&b.ThreadID, "thread", "", "thread_id (required)")
	fs.StringVar(&b.RunnerSessionID, "session", "", "runner_session_id (required)")
	return b
}

// cliReleaseFlags registers the release flags.
func cliReleaseFlags(fs *flag.FlagSet) *wire.Release {
	r := &wire.Release{}
	fs.StringVar(&r.ReleaseSetID, "release-set-id", "", "release_set_id of the signed release (required)")
	cliVar(fs, &r.RuntimeClass, "runtime-class", "kata_microvm or gvisor_lower_risk (required)", func(v string) (lease.RuntimeClass, error) {
		if !lease.RuntimeClass(v).Valid() {
			return "", errors.New("must be kata_microvm or gvisor_lower_risk")
		}
		return lease.RuntimeClass(v), nil
	})
	fs.StringVar(&r.PolicyDigest, "policy-digest", "", "policy_digest: 64 lowercase hex digits (required)")
	fs.StringVar(&r.Signature, "release-signature", "", "release signature swrs1_… (required)")
	return r
}

// cliValue is a flag parsed into *p. Its String is "" while *p is zero, so
// the required check sees it unset.
type cliValue[T comparable] struct {
	p     *T
	parse func(string) (T, error)
}

func (v *cliValue[T]) String() string {
	var zero T
	if v.p == nil || *v.p == zero {
		return ""
	}
	return fmt.Sprint(*v.p)
}

func (v *cliValue[T]) Set(s string) error {
	x, err := v.parse(s)
	if err == nil {
		*v.p = x
	}
	return err
}

// cliVar registers a flag parsed by parse into *p, and returns p.
func cliVar[T comparable](fs *flag.FlagSet, p *T, name, usage string, parse func(string) (T, error)) *T {
	fs.Var(&cliValue[T]{p, parse}, name, usage)
	return p
}

// cliUUID registers a UUID flag.
func cliUUID(fs *flag.FlagSet, name, usage string) *uuid.UUID {
	return cliVar(fs, new(uuid.UUID), name, usage, func(v string) (uuid.UUID, error) {
		u, err := uuid.Parse(v)
		if err != nil {
			return uuid.Nil, errors.New("not a UUID")
		}
		return u, nil
	})
}

// cliUint registers an optional unsigned flag; the pointer stays nil when
// the flag is absent.
func cliUint(fs *flag.FlagSet, name, usage string) **uint64 {
	p := new(*uint64)
	fs.Func(name, usage, func(v string) error {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return errors.New("not an unsigned integer")
		}
		*p = &n
		return nil
	})
	return p
}

// cliDisposition registers a disposition flag.
func cliDisposition(fs *flag.FlagSet) *lease.Disposition {
	d := lease.Destroyed
	return cliVar(fs, &d, "disposition", "destroyed or quarantined", func(v string) (lease.Disposition, error) {
		if !lease.ValidDisposition(lease.Disposition(v)) {
			return "", errors.New("must be destroyed or quarantined")
		}
		return lease.Disposition(v), nil
	})
}

// cliJSON prints v as indented JSON.
func cliJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func cliTime(t wire.Time) string { return attest.WireTime(t.Time) }

func cliLeaseKV(l wire.Lease) []string {
	return []string{
		"lease_id", l.LeaseID.String(),
		"cell_id", l.CellID.String(),
		"generation", strconv.FormatUint(l.Generation, 10),
		"expires_at", cliTime(l.ExpiresAt),
		"runtime_class", string(l.Release.RuntimeClass),
	}
}

func cliStatusKV(s wire.LeaseStatus) []string {
	disp := "null"
	if s.Disposition != nil {
		disp = string(*s.Disposition)
	}
	kv := []string{
		"lease_id", s.LeaseID.String(),
		"cell_id", s.CellID.String(),
		"generation", strconv.FormatUint(s.Generation, 10),
		"state", string(s.State),
		"disposition", disp,
		"provider_absent", strconv.FormatBool(s.ProviderAbsent),
		"cleanup_pending", strconv.FormatBool(s.CleanupPending),
	}
	if s.ProviderMode != "" {
		kv = append(kv, "provider_mode", s.ProviderMode)
	}
	return kv
}

func cliCellKV(c wire.Cell) []string {
	disp := "null"
	if c.Disposition != nil {
		disp = string(*c.Disposition)
	}
	return []string{
		"cell_id", c.CellID.String(),
		"worker_id", c.WorkerID,
		"provider_cell_id", c.ProviderCellID,
		"state", string(c.State),
		"generation", strconv.FormatUint(c.Generation, 10),
		"runtime_class", string(c.Release.RuntimeClass),
		"expires_at", cliTime(c.ExpiresAt),
		"disposition", disp,
	}
}

// hasToken reports whether a bearer token is configured.
func (f *cliFlags) hasToken() bool {
	return f.tokenFile != "" || strings.TrimSpace(f.e.getenv("SANDBOXWICH_TOKEN")) != ""
}

// claimJSON is claim's --json output: the claim response with the
// attestation replaced by the path of the file that holds it.
type claimJSON struct {
	OK              bool        `json:"ok"`
	ClaimID         uuid.UUID   `json:"claim_id"`
	Lease           *wire.Lease `json:"lease"`
	AttestationFile *string     `json:"attestation_file"`
	EmptyReason     string      `json:"empty_reason,omitempty"`
}

func cliClaim(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "claim")
	rel := cliReleaseFlags(f.fs)
	b := cliBinding(f.fs)
	leaseSeconds := cliUint(f.fs, "lease-seconds", "requested lease duration in seconds (server default 120, clamped into [1, 300])")
	claimID := cliUUID(f.fs, "claim-id", "claim ID fence (default: a new UUIDv7); repeat a claim with the same ID to get the same outcome")
	image := f.fs.String("image", "", "a cell of this image, pinned by digest (host/repo@sha256:<hex>), from a pool that runs or allows it")
	waitSeconds := cliUint(f.fs, "wait-seconds", "wait up to this many seconds (at most 300) for a cell when none is ready (default 0: answer at once)")
	allow := f.fs.String("egress", "", `narrow the pool's egress allow-list to these comma-separated host[:port] entries ("none": no egress; default: the pool's)`)
	attFile := f.fs.String("attestation-file", "", "NEW file to write the lease attestation to, mode 0600 (required; never printed)")
	if err := f.parse(args, false); err != nil {
		return err
	}
	req := wire.ClaimRequest{Release: *rel, Binding: *b, LeaseSeconds: *leaseSeconds, WaitSeconds: *waitSeconds}
	switch *allow {
	case "":
	case "none":
		req.Egress = &[]string{}
	default:
		entries := strings.Split(*allow, ",")
		req.Egress = &entries
	}
	if *image != "" {
		req.Image = image
	}
	if w := *waitSeconds; w != nil && !f.set("timeout") {
		// Give the wait its time unless --timeout was set explicitly.
		f.timeout = max(f.timeout, time.Duration(*w)*time.Second+30*time.Second)
	}
	if *claimID != uuid.Nil {
		req.ClaimID = claimID
	}

	// Create the file before claiming: a bad or existing path consumes
	// nothing.
	out, err := os.OpenFile(*attFile, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("--attestation-file %s already exists; refusing to overwrite it (nothing was claimed)", *attFile)
	}
	if err != nil {
		return fmt.Errorf("--attestation-file: %w (nothing was claimed)", err)
	}
	discard := func() {
		_ = out.Close()
		_ = os.Remove(*attFile)
	}

	cl, err := call(ctx, f, func(ctx context.Context, c *client.Client) (client.Claim, error) {
		cl, err := c.Claim(ctx, req)
		if final, ok := errors.AsType[*client.Error](err); err != nil && (!ok || final.Status >= 500 || final.Code == errcode.ClaimContended) {
			err = fmt.Errorf("%w\nclaim_id %s: the claim may have been carried out; repeat with --claim-id %s to get its outcome (never a second cell)",
				err, cl.ClaimID, cl.ClaimID)
		}
		return cl, err
	})
	if err != nil {
		discard()
		return err
	}
	if cl.Empty() {
		discard()
		if f.json {
			if err := cliJSON(e.stdout, claimJSON{OK: true, ClaimID: cl.ClaimID, EmptyReason: cl.EmptyReason}); err != nil {
				return err
			}
		}
		why := "no ready cell matched"
		switch cl.EmptyReason {
		case "wait_elapsed":
			why = "no cell came within --wait-seconds"
		case "capacity":
			why = "no cell came within --wait-seconds: the image class had no room for one (its max_cells are in use)"
		}
		fmt.Fprintf(e.stderr, "sandboxwich claim: %s; nothing was leased (claim_id %s)\n", why, cl.ClaimID)
		return cliEmptyClaim
	}
	_, werr := out.WriteString(cl.Attestation())
	if werr == nil {
		werr = out.Sync()
	}
	if cerr := out.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.Remove(*attFile)
		return fmt.Errorf("lease %s was claimed but its attestation could not be saved: %w\n"+
			"repeat with --claim-id %s and a new --attestation-file to get the same lease", cl.Lease.LeaseID, werr, cl.ClaimID)
	}
	return f.output(claimJSON{OK: true, ClaimID: cl.ClaimID, Lease: cl.Lease, AttestationFile: attFile},
		append(cliLeaseKV(*cl.Lease), "claim_id", cl.ClaimID.String(), "attestation", "written to "+*attFile+" (mode 0600)"))
}

// proofFlags are the flags of commands that present a lease fence.
type proofFlags struct {
	leaseID    *uuid.UUID
	attFile    *string
	generation *uint64
	binding    *wire.Binding
}

func cliProofFlags(fs *flag.FlagSet) *proofFlags {
	return &proofFlags{
		leaseID:    cliUUID(fs, "lease-id", "lease ID (required)"),
		attFile:    fs.String("attestation-file", "", "file holding the lease attestation, as written by claim (required)"),
		generation: fs.Uint64("generation", lease.GenerationLeased, "lease generation"),
		binding:    cliBinding(fs),
	}
}

// proof reads the attestation file.
func (p *proofFlags) proof() (wire.LeaseProof, error) {
	att, err := cliReadSecretFile(*p.attFile)
	if err != nil {
		return wire.LeaseProof{}, fmt.Errorf("--attestation-file: %w", err)
	}
	if att == "" {
		return wire.LeaseProof{}, fmt.Errorf("--attestation-file %s is empty", *p.attFile)
	}
	return wire.LeaseProof{LeaseAttestation: att, Generation: *p.generation, Binding: *p.binding}, nil
}

func cliValidate(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "validate")
	pf := cliProofFlags(f.fs)
	if err := f.parse(args, false); err != nil {
		return err
	}
	proof, err := pf.proof()
	if err != nil {
		return err
	}
	l, err := call(ctx, f, func(ctx context.Context, c *client.Client) (wire.Lease, error) {
		return c.Validate(ctx, *pf.leaseID, proof)
	})
	if err != nil {
		return err
	}
	return f.output(wire.ValidateResponse{OK: true, Lease: l}, append([]string{"valid", "true"}, cliLeaseKV(l)...))
}

func cliRelease(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "release")
	pf := cliProofFlags(f.fs)
	d := cliDisposition(f.fs)
	wait := f.fs.Bool("wait", false, "wait until the provider proved the cell gone (provider_absent), within --timeout")
	poll := f.fs.Duration("poll", client.DefaultPoll, "status polling interval of --wait")
	if err := f.parse(args, false); err != nil {
		return err
	}
	proof, err := pf.proof()
	if err != nil {
		return err
	}
	st, err := call(ctx, f, func(ctx context.Context, c *client.Client) (wire.LeaseStatus, error) {
		st, err := c.Release(ctx, *pf.leaseID, proof, *d)
		if err != nil || !*wait {
			return st, err
		}
		st2, err := c.WaitProviderAbsent(ctx, *pf.leaseID, *poll)
		if err != nil {
			// The release itself was recorded; say where the wait stopped.
			if st2.LeaseID != uuid.Nil {
				st = st2
			}
			_ = cliKV(e.stderr, cliStatusKV(st))
			return st, fmt.Errorf("release recorded, but waiting for provider_absent failed: %w", err)
		}
		return st2, nil
	})
	if err != nil {
		return err
	}
	return f.output(wire.StatusResponse{OK: true, Status: st}, cliStatusKV(st))
}

func cliRenew(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "renew")
	pf := cliProofFlags(f.fs)
	var seconds uint64
	cliVar(f.fs, &seconds, "lease-seconds", "the lease's new length from now, in seconds (required; the server clamps it to its "+
		"maximum lease and the cell's lifetime cap, and never shortens the lease)", func(v string) (uint64, error) {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return 0, errors.New("must be a whole number of seconds, at least 1")
		}
		return n, nil
	})
	if err := f.parse(args, false); err != nil {
		return err
	}
	proof, err := pf.proof()
	if err != nil {
		return err
	}
	l, err := call(ctx, f, func(ctx context.Context, c *client.Client) (wire.Lease, error) {
		return c.Renew(ctx, *pf.leaseID, proof, seconds)
	})
	if err != nil {
		return err
	}
	return f.output(wire.RenewResponse{OK: true, Lease: l}, cliLeaseKV(l))
}

func cliLease(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "lease")
	leaseID := cliUUID(f.fs, "lease-id", "lease ID (required)")
	if err := f.parse(args, false); err != nil {
		return err
	}
	st, err := call(ctx, f, func(ctx context.Context, c *client.Client) (wire.LeaseStatus, error) { return c.Lease(ctx, *leaseID) })
	if err != nil {
		return err
	}
	return f.output(wire.StatusResponse{OK: true, Status: st}, cliStatusKV(st))
}

func cliPools(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "pools")
	if err := f.parse(args, false); err != nil {
		return err
	}
	pools, err := call(ctx, f, func(ctx context.Context, c *client.Client) ([]wire.Pool, error) {
		pools, err := c.Pools(ctx)
		if errors.Is(err, errcode.ErrUnauthorized) {
			err = fmt.Errorf("%w\nhint: pools needs the operator token as well (SANDBOXWICH_OPERATOR_TOKEN or --operator-token-file)", err)
		}
		return pools, err
	})
	if err != nil {
		return err
	}
	if f.json {
		if pools == nil {
			pools = []wire.Pool{}
		}
		return cliJSON(e.stdout, wire.PoolsResponse{OK: true, Pools: pools})
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tPROVIDER\tMODE\tTARGET\tREADY\tLEASED\tSTOPPING\tCLEANUP_PENDING\tLAST_ERROR")
	for _, p := range pools {
		lastErr := "-"
		if p.LastError != nil && *p.LastError != "" {
			lastErr = strings.Join(strings.Fields(*p.LastError), " ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\n", p.Name, p.Provider, p.Mode, p.Target,
			p.Members[string(lease.MemberReady)], p.Members[string(lease.MemberLeased)],
			p.Members[string(lease.MemberStopping)], p.Members[string(lease.MemberCleanupPending)], lastErr)
	}
	return tw.Flush()
}

// cliWorkerCellFlags registers --worker-id, defaulting to
// SANDBOXWICH_WORKER_ID, and --cell-id.
func cliWorkerCellFlags(e env, f *cliFlags, cellUsage string) (workerID, cellID *uuid.UUID) {
	workerID = cliUUID(f.fs, "worker-id", "the worker's ID (required; default env SANDBOXWICH_WORKER_ID)")
	if v, err := uuid.Parse(strings.TrimSpace(e.getenv("SANDBOXWICH_WORKER_ID"))); err == nil {
		*workerID = v
	}
	return workerID, cliUUID(f.fs, "cell-id", cellUsage)
}

func cliPrepare(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "prepare")
	workerID, cellID := cliWorkerCellFlags(e, f, "ID of the new cell (default: a new UUIDv7)")
	rel := cliReleaseFlags(f.fs)
	providerCellID := f.fs.String("provider-cell-id", "", "the provider's name of the cell (required)")
	expiresIn := f.fs.Duration("expires-in", 10*time.Minute, "ready deadline, from now")
	expiresAt := f.fs.String("expires-at", "", "ready deadline as an RFC 3339 timestamp (overrides --expires-in)")
	if err := f.parse(args, false); err != nil {
		return err
	}
	deadline := time.Now().Add(*expiresIn)
	if *expiresAt != "" {
		t, err := time.Parse(time.RFC3339Nano, *expiresAt)
		if err != nil {
			return fmt.Errorf("%w: --expires-at: not an RFC 3339 timestamp", errUsage)
		}
		deadline = t
	}
	if *cellID == uuid.Nil {
		id, err := uuid.NewV7()
		if err != nil {
			return err
		}
		*cellID = id
	}
	return cliCellCall(ctx, f, func(ctx context.Context, c *client.Client) (wire.Cell, error) {
		cell, err := c.Prepare(ctx, *workerID, wire.PrepareRequest{CellID: *cellID, Release: *rel, ProviderCellID: *providerCellID,
			ExpiresAt: wire.Time{Time: deadline.UTC().Truncate(time.Microsecond)}})
		if err != nil {
			return cell, fmt.Errorf("prepare cell %s: %w", *cellID, err)
		}
		return cell, nil
	})
}

// cliCellCall makes a worker call that answers a cell, and prints it.
func cliCellCall(ctx context.Context, f *cliFlags, do func(context.Context, *client.Client) (wire.Cell, error)) error {
	cell, err := call(ctx, f, do)
	if err != nil {
		return err
	}
	return f.output(wire.CellResponse{OK: true, Cell: cell}, cliCellKV(cell))
}

func cliCell(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "cell")
	workerID, cellID := cliWorkerCellFlags(e, f, "cell ID (required)")
	if err := f.parse(args, false); err != nil {
		return err
	}
	resp, err := call(ctx, f, func(ctx context.Context, c *client.Client) (wire.WorkerCellResponse, error) {
		return c.WorkerCell(ctx, *workerID, *cellID)
	})
	if err != nil {
		return err
	}
	resp.OK = true
	kv := cliCellKV(resp.Cell)
	if cl := resp.Claim; cl != nil {
		kv = append(kv, "claim_id", cl.ClaimID.String(), "lease_id", cl.LeaseID.String(),
			"lease_generation", strconv.FormatUint(cl.Generation, 10), "lease_expires_at", cliTime(cl.ExpiresAt))
	}
	return f.output(resp, kv)
}

func cliRetire(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "retire")
	workerID, cellID := cliWorkerCellFlags(e, f, "cell ID (required)")
	generation := f.fs.Uint64("generation", lease.GenerationReady, "generation of the ready cell")
	if err := f.parse(args, false); err != nil {
		return err
	}
	return cliCellCall(ctx, f, func(ctx context.Context, c *client.Client) (wire.Cell, error) {
		return c.Retire(ctx, *workerID, *cellID, *generation)
	})
}

func cliDestroy(ctx context.Context, e env, args []string) error {
	f := newCLIFlags(e, "destroy")
	workerID, cellID := cliWorkerCellFlags(e, f, "cell ID (required)")
	leaseID := cliUUID(f.fs, "lease-id", "the cell's lease ID (required)")
	generation := f.fs.Uint64("generation", lease.GenerationLeased, "the lease's generation")
	d := cliDisposition(f.fs)
	if err := f.parse(args, false); err != nil {
		return err
	}
	return cliCellCall(ctx, f, func(ctx context.Context, c *client.Client) (wire.Cell, error) {
		return c.Destroy(ctx, *workerID, *cellID, wire.DestroyRequest{LeaseID: *leaseID, Generation: *generation, Disposition: *d})
	})
}
