// Package agentsandbox backs sterile cells with the warm Pods of
// kubernetes-sigs/agent-sandbox (v0.5.6 CRDs): each cell is one
// SandboxClaim drawn from a SandboxWarmPool, bound by UID and verified
// from what the API server stored. It speaks to the API server through
// client-go's dynamic client (agent-sandbox's Go module is not needed).
//
//   - Provision creates the SandboxClaim ClaimName(cellID) in
//     Config.Namespace (extensions.agents.x-k8s.io/v1beta1 with
//     spec.warmPoolRef.name = Config.WarmPool; v1alpha1 with
//     spec.sandboxTemplateRef.name = Config.Template only when discovery
//     shows v1beta1 is not served), labelled LabelManagedBy, LabelPool,
//     LabelCellID and LabelRuntimeClass. It then follows, until
//     BindTimeout, claim status.sandbox.name → Sandbox → status.selector →
//     exactly one Pod that has a controller owner reference to that
//     Sandbox's UID, carries LabelClaimUID equal to the claim's UID, is
//     Running and ready, has never restarted a container (nor had an
//     ephemeral container attached), and was admitted with the
//     RuntimeClass name configured for the requested class. The identity
//     "claim=<uid>,sandbox=<name>/<uid>,pod=<name>/<uid>" records the
//     chain. A chain that is whole but wrong (two Pods selected, another
//     owner or claim UID, a restarted Pod, no or another RuntimeClass)
//     fails at once with a *driver.VerifyError
//     (runtime_class_boundary_unverified); a claim not bound in time fails
//     with an ordinary error. Either way the claim is left for Destroy.
//     A cell's image is the warm pool's SandboxTemplate's, which the plane
//     does not choose: Capabilities report no Images, and a request that
//     names one (driver.ProvisionRequest.Image, an image class's cell,
//     CONTRACT §21) fails with ErrImageFromTemplate before anything is
//     created.
//   - Inspect follows the chain afresh. It reports the RuntimeClass only
//     when the same three UIDs are found, the chain is consistent, and
//     the Pod is Running with zero restarts and the configured
//     runtimeClassName. Exec re-verifies the same way before every
//     command. Observation.ImageDigest is the repo digest in the bound
//     Pod's first container's imageID ("repo@sha256:…"), "" when the
//     kubelet reports none (a locally imported image) or when the
//     template's image is pinned by another digest; a pool whose key
//     image pins a digest admits only a chain reporting it (CONTRACT §15).
//   - Destroy deletes the claim with foreground propagation and a UID
//     precondition, then reads the claim, the Sandbox and the Pod back by
//     name until each is absent or its name belongs to another UID. Until
//     then the result wraps driver.ErrUncertain: the pool quarantines the
//     member and retries. An empty identity names whatever the cell's
//     claim (if it carries this pool's labels) is bound to now.
//   - List finds the pool's claims by label, for orphan reconciliation:
//     sandboxwich.dev/pool and sandboxwich.dev/installation
//     (Config.Installation, the plane's installation tag), so two planes
//     sharing a namespace and a pool name never list each other's claims.
//     Claims are named and found by cell (sbw-<cell-uuid>), and ownership
//     checks do not require the installation label, so claims created
//     before it keep being verified and destroyed.
//   - Exec runs commands through pods/exec exactly as driver/kubernetes
//     does (WebSocket with SPDY fallback, env, stdin, output caps, a
//     timeout that kills the process tree with a second exec).
//
// The Sandbox's own owner is not required to be the claim (agent-sandbox
// versions differ in how a claim adopts a warm Sandbox); a Sandbox whose
// controller is another SandboxClaim is refused. The Pod's labels,
// owner, phase, restarts and runtimeClassName are what bind it.
//
// # What the tests exercise, and what they do not
//
// Against a real kube-apiserver v1.37.2 (internal/k8stest) with the
// v0.5.6 CRDs of testdata/crds installed, kwok v0.8.0 running the Pods of
// a fake node, and a test controller playing agent-sandbox (it creates a
// Sandbox controlled by the claim and a Pod controlled by the Sandbox,
// writes status through /status, and emulates the garbage collector for
// foreground deletion): driver/drivertest (without Exec); the happy path;
// a RuntimeClass stripped by a real mutating webhook; another
// RuntimeClass; two Pods selected; owner and claim-uid mismatches; a
// restarted Pod; deletion never confirmed (uncertain, then proven on
// retry); a claim never bound; re-verification before exec; destroy
// without identity and refusal to delete another pool's claim; refusal
// of a requested image.
//
// Not exercised: the real agent-sandbox controllers (the test controller
// is an emulation written from the CRDs and the documented contract), the
// real garbage collector, the v1alpha1 fallback, and exec into a
// container — kwok runs no containers, so only the verification Exec
// does before streaming is tested here; the streaming code is the
// kubernetes driver's, tested there against a kubelet stand-in.
package agentsandbox
