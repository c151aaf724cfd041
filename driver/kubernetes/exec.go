package kubernetes

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/driver/internal/podexec"
	"github.com/sandboxwich/sandboxwich/lease"
)

// Exec implements driver.Execer through the API server's pods/exec
// subresource (WebSocket, falling back to SPDY, as kubectl does).
//
// Before the command runs, the Pod is read back and verified as at
// provisioning: it must exist under obj.Identity (else driver.ErrNotFound),
// carry this pool's labels, and have been admitted with the RuntimeClass
// configured for the class recorded in its LabelRuntimeClass label (else a
// *driver.VerifyError); it must be ready. The plane verifies against the
// signed class as well.
//
// The command runs in the cell container as `sh -c <wrapper> …`: the
// wrapper exports req.Env (names must be shell identifiers) and execs
// argv, so the image needs a POSIX sh; it leaves a PID file
// /tmp/.sbw-exec-<random id> per command in the cell. Argv and Env travel in the exec
// request's URL and so reach the API server's audit log: never put secrets
// in them (use Stdin). When req.Timeout expires, the driver kills the
// command and every process still in its process tree with a second exec,
// and reports TimedOut; when ctx ends first it does the same and returns
// ctx's error. Stdout and stderr are each kept up to req.MaxOutput bytes
// and drained beyond it (Truncated). Zero Timeout and MaxOutput mean
// driver.DefaultExecTimeout and agent.DefaultMaxOutput.
func (p *Provider) Exec(ctx context.Context, obj driver.Object, req driver.ExecRequest) (driver.ExecResult, error) {
	name := PodName(obj.CellID)
	fail := func(err error) (driver.ExecResult, error) {
		return driver.ExecResult{}, fmt.Errorf("kubernetes: exec in %s: %w", name, err)
	}
	if err := podexec.Check(req); err != nil {
		return fail(err)
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	if p.cfg.RESTConfig == nil {
		return fail(errors.New("no REST config: exec needs one"))
	}
	pod, err := p.pods().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return fail(driver.ErrNotFound)
	}
	if err != nil {
		return fail(err)
	}
	if obj.Identity != "" && string(pod.UID) != obj.Identity {
		return fail(fmt.Errorf("%w: the pod is now uid %s", driver.ErrNotFound, pod.UID))
	}
	if pod.DeletionTimestamp != nil {
		return fail(fmt.Errorf("%w: the pod is terminating", driver.ErrNotFound))
	}
	o := p.observe(pod, "")
	if err := driver.Verify(driver.Object{CellID: obj.CellID, Identity: string(pod.UID)}, o,
		lease.RuntimeClass(pod.Labels[LabelRuntimeClass])); err != nil {
		return fail(err)
	}
	if !o.Ready {
		return fail(fmt.Errorf("pod is not ready: %s", o.Detail))
	}
	res, err := p.exec.Run(ctx, name, ContainerName, req)
	if err != nil {
		return fail(err)
	}
	return res, nil
}
