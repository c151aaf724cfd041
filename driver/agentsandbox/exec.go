package agentsandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/internal/podexec"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Exec implements driver.Execer through the API server's pods/exec
// subresource (WebSocket, falling back to SPDY, as kubectl does), as the
// kubernetes driver does.
//
// Before the command runs, the chain is followed afresh and verified as at
// binding: the claim must exist under obj.Identity's claim UID and resolve
// to the same Sandbox and Pod (else driver.ErrNotFound); the chain must be
// consistent and the Pod admitted with the RuntimeClass configured for the
// class the claim was made for (else a *driver.VerifyError); the Pod must
// be ready. The plane verifies against the signed class as well.
//
// The command runs in Config.Container (default: the Pod's first
// container) as `sh -c <wrapper> …`: the wrapper exports req.Env (names
// must be shell identifiers) and execs argv, so the image needs a POSIX
// sh; it leaves a PID file /tmp/.sbw-exec-<random id> per command. Argv and
// Env travel in the exec request's URL and so reach the API server's audit
// log: never put secrets in them (use Stdin). When req.Timeout expires,
// the driver kills the command's process tree with a second exec and
// reports TimedOut; when ctx ends first it does the same and returns ctx's
// error. Zero Timeout and MaxOutput mean driver.DefaultExecTimeout and
// agent.DefaultMaxOutput.
func (p *Provider) Exec(ctx context.Context, obj driver.Object, req driver.ExecRequest) (driver.ExecResult, error) {
	name := ClaimName(obj.CellID)
	fail := func(err error) (driver.ExecResult, error) {
		return driver.ExecResult{}, fmt.Errorf("agentsandbox: exec in %s: %w", name, err)
	}
	if err := podexec.Check(req); err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	c, err := p.resolve(ctx, obj.CellID)
	if err != nil {
		return fail(err)
	}
	if c.claim == nil {
		return fail(driver.ErrNotFound)
	}
	if want, ok := parseIdentity(obj.Identity); obj.Identity != "" && (!ok || want.Claim != c.id.Claim) {
		return fail(fmt.Errorf("%w: the claim is now uid %s", driver.ErrNotFound, c.id.Claim))
	}
	if c.claim.GetDeletionTimestamp() != nil {
		return fail(fmt.Errorf("%w: the claim is being deleted", driver.ErrNotFound))
	}
	o := c.observe(obj)
	recorded := obj
	if recorded.Identity == "" {
		recorded.Identity = o.Identity
	}
	if err := driver.Verify(recorded, o, lease.RuntimeClass(c.claim.GetLabels()[LabelRuntimeClass])); err != nil {
		var ve *driver.VerifyError
		if errors.As(err, &ve) {
			err = &driver.VerifyError{Reason: ve.Reason + " (" + o.Detail + ")"}
		}
		return fail(err)
	}
	if !o.Ready {
		return fail(fmt.Errorf("pod is not ready: %s", o.Detail))
	}
	pod, container := c.pod.Name, p.cfg.Container
	if container == "" {
		container = c.pod.Spec.Containers[0].Name
	}
	res, err := p.exec.Run(ctx, pod, container, req)
	if err != nil {
		return fail(err)
	}
	return res, nil
}
