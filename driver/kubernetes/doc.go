// Package kubernetes runs sterile cells as Kubernetes Pods with a
// RuntimeClass (gVisor, Kata…), through client-go.
//
// Writing runtimeClassName into a manifest is not evidence: a mutating
// admission webhook can remove or change it, and the API server admits
// what the webhooks return. So the driver proves the boundary from what
// the API server stored, and proves deletion by UID:
//
//   - Provision creates one Pod per cell — named PodName(cellID) in
//     Config.Namespace, labelled with LabelManagedBy, LabelPool and
//     LabelCellID, its image recorded in AnnotationImage (see "Images"
//     below) — and reads it back: spec.runtimeClassName must be the
//     RuntimeClass name configured for the requested class, the cell
//     container's image and the record exactly the requested image, and
//     the UID the one created, or Provision fails with a
//     *driver.VerifyError (runtime_class_boundary_unverified) and leaves
//     the Pod for the pool's Destroy. It then waits, bounded by
//     ReadyTimeout, until the Pod is Running with every container ready,
//     re-checking on every read. It is idempotent: an existing Pod of the
//     cell (same labels, same image) is returned.
//   - Inspect reports the admitted class from spec.runtimeClassName, "" when
//     it is missing or unknown, or when admission weakened the Pod (a host
//     namespace, a privileged or escalating container, a service-account
//     token, an image other than the one it records, foreign labels). The
//     plane compares it with the signed class after provisioning and
//     before every exec; Exec re-checks it itself as well.
//     Observation.ImageDigest is the repo digest of the cell container's
//     status.containerStatuses[].imageID ("repo@sha256:…", also behind
//     docker-pullable://), "" before the kubelet reports one and for a
//     locally imported image (a bare image ID carries no repo digest). A
//     pool whose key image pins the digest (the setting image,
//     SANDBOXWICH_KUBERNETES_IMAGE, is that key), or a cell of an image
//     class, is admitted only when the two match (CONTRACT §15,
//     image_digest_unverified otherwise).
//   - Destroy deletes with a UID precondition and returns nil only when the
//     API server says the Pod is gone or that its name now belongs to
//     another UID. Deletion is graceful, so on a real cluster the Pod object
//     disappears only once the kubelet reported its containers stopped. A
//     timeout, an error, or a Pod still Terminating when ctx ends wraps
//     driver.ErrUncertain: the pool keeps the member cleanup_pending and
//     counted, and retries.
//   - List finds the pool's Pods by their ownership labels, for orphan
//     reconciliation: sandboxwich.dev/pool and
//     sandboxwich.dev/installation (Config.Installation, the plane's
//     installation tag), so two planes sharing a namespace and a pool name
//     never list each other's Pods. Pods are named and found by cell
//     (sbw-<cell-uuid>); Inspect and Destroy do not require the
//     installation label, so Pods created before it keep being verified
//     and destroyed.
//   - Exec runs commands through pods/exec (WebSocket v5, falling back to
//     SPDY, as kubectl does) with stdin, env, exit codes, output caps and a
//     timeout that kills the command's process tree with a second exec.
//
// Each Pod has no service-account token and no service links, shares no
// host namespace, runs non-root with every capability dropped, no privilege
// escalation, seccomp RuntimeDefault, a read-only root file system with a
// memory-backed emptyDir at /tmp, CPU and memory requests equal to limits,
// restartPolicy Never, and a digest-pinned image. The cell's writable
// storage, the emptyDirs it writes (/tmp, and the agent's home, half each)
// together and its ephemeral-storage limit, is Config.CellDiskBytes (the
// pool key cell_disk_bytes, below the memory; default half of it): the
// kubelet mounts each emptyDir as a tmpfs of its size, so a full one is
// ENOSPC in the cell, and Inspect refuses an admitted Pod whose writable
// storage is larger or unbounded. The Pod passes the "restricted" Pod
// Security Standard. Unless Config.NetworkPolicy is false,
// a deny-all NetworkPolicy (no ingress, no egress) selects the pool's Pods
// before the first is created; a CNI plugin that enforces NetworkPolicy is
// what makes it bite. deploy/kubernetes holds the minimal RBAC.
//
// # Images
//
// Capabilities report Images: a provision may name its cell's image
// (driver.ProvisionRequest.Image), as the pools of an image class do
// (CONTRACT §21).
//
//   - The cell container runs req.Image when it is set, exactly as given
//     (a tag before the digest is kept for display; the runtime pulls by
//     the digest), and Config.Image otherwise — the setting image
//     (SANDBOXWICH_KUBERNETES_IMAGE), the pool's key image. req.Image must
//     be pinned by digest (host/repo@sha256:<64 hex>, internal/imageref's
//     syntax): a tag alone or a malformed reference fails Provision with
//     an error wrapping *imageref.Error before anything is created — no
//     NetworkPolicy, Secret or Pod.
//   - Config.Image is required, unless Config.ImageClass (the setting
//     image_class, which the plane sets for a pool with the key images)
//     says the pool is an image class; it must then be empty, and a
//     provision that names no image fails with ErrNoImage, creating
//     nothing. New's error for a missing image says so.
//   - The expected image is per cell, so the Pod records it at creation in
//     the annotation AnnotationImage (sandboxwich.dev/image). Provision
//     and its wait for readiness require the admitted cell container's
//     image and the record to equal what the request asked for (a
//     webhook that rewrote the image, the record or both is caught, and a
//     retried Provision for another image than the existing Pod's is
//     refused). Inspect and Exec, which are not told the image, require
//     the container to run the image the Pod records, which must be
//     pinned by digest; a Pod without a record (created before it)
//     expects Config.Image. The cell has no credential to change its Pod.
//     What the runtime serves is checked by the plane: it compares
//     Observation.ImageDigest, the repo digest of the kubelet's imageID
//     for the cell container (never the request or the record), with the
//     digest the cell's image is pinned by (CONTRACT §15), at admission
//     and before every operation — which also catches a Pod whose image
//     and record were both changed after Provision.
//
// # The cell agent over per-cell mutual TLS
//
// With Config.AgentImage (an image pinned by digest holding the static
// agent at AgentImageBinary), every cell runs the cell agent of CONTRACT
// §13, and Provider.Driver returns an AgentProvider (driver.AgentHost):
// exec, files and launch go through the agent; without it Driver returns
// the Provider itself and exec goes through pods/exec.
//
//   - Before the Pod, Provision creates two immutable Secrets carrying the
//     Pod's labels: ControlSecretName (the CA certificate and key, and the
//     client leaf with URI SAN spiffe://sandboxwich/cell/<cell>/control),
//     mounted into no Pod, and AgentSecretName (the CA certificate and the
//     server leaf, URI SAN …/agent), mounted read-only into the cell. A
//     retried Provision adopts the CA of the control Secret it finds,
//     issuing the agent leaf again from its key when the agent Secret is
//     missing: a cell never has two CAs. Keys are ECDSA P-256
//     (agent.NewCellPKI).
//   - The Pod's init container AgentInitContainerName, from the agent
//     image, copies the agent into an emptyDir; the cell container, as the
//     cell user (agent.CellUID), runs it as its entrypoint with
//     -listen tcp:0.0.0.0:<AgentPort>, the Secret's files and -digest set
//     to the image's pinned digest. Inspect reports Observation.AgentDigest
//     from the init container's status imageID (driver.RepoDigest): the
//     pool requires the agent to report exactly it. A Pod admitted without
//     that init container or with another agent image is weakened.
//   - AgentProvider.Provision returns only once the agent answers its
//     status over the channel (within ReadyTimeout): the pool reads the
//     agent's readiness evidence at once.
//   - Agent reads the Pod and the control Secret from the API server (a
//     restarted plane needs nothing else), dials the Pod IP and the agent
//     port, and verifies the agent's leaf against the cell's CA by its URI
//     SAN, never by the address (agent.ClientTLS); the agent accepts only
//     the cell's control leaf (agent.ServerTLS). TLS 1.3 only.
//   - Destroy, once the Pod is gone, deletes both Secrets with UID
//     preconditions and reads them back until absent: a Secret it cannot
//     prove gone keeps the result driver.ErrUncertain. List also reports
//     a cell whose Secrets outlived its Pod (Identity empty), so orphan
//     reconciliation removes them.
//
// Process limits: a Pod spec cannot cap its processes; the kubelet does,
// with podPidsLimit in its configuration (--pod-max-pids), for every Pod of
// the node. The driver sets none and has no pids_limit setting: a cluster
// that runs cells sets podPidsLimit (1024 matches the gVisor driver's
// default), or a fork bomb in a cell is bounded only by its memory limit.
//
// # What the tests exercise, and what they do not
//
// Against a real kube-apiserver v1.37.2 with etcd v3.6.16 (built from Go
// modules by scripts/k8s-binaries.sh, run by controller-runtime's envtest,
// see internal/k8stest) and kwok v0.8.0 playing the kubelet of a fake
// node: driver/drivertest's conformance suite; admission by the real API
// server, including a mutating webhook (served by the test over HTTPS)
// that strips runtimeClassName or swaps it for another class, or rewrites
// the cell container's image or its record; per-cell images, refused
// unpinned ones and image-class providers; RuntimeClass
// objects and the restricted Pod Security admission; UID preconditions;
// graceful deletion finalized by kwok; a finalizer holding a Pod
// Terminating (unprovable deletion); out-of-band deletion and a new Pod
// under the same name; an API server stopped and restarted mid-flight; the
// Role of deploy/kubernetes/rbac.yaml as the only permissions; and the pool
// reconciler (quarantine with proof, replacement, cleanup_pending holding
// capacity, orphan destruction) over the real server. Fault cases the real
// server cannot produce on demand (a delete accepted while the Pod keeps
// being returned, errors on each call) use client-go's fake clientset.
//
// Not exercised against a real kubelet or container runtime: kwok runs no
// containers, so no image is pulled, no RuntimeClass handler (runsc, kata)
// starts anything, the security context is not enforced by a runtime, the
// NetworkPolicy is stored but not enforced, and "Running and ready" is what
// kwok reports. Exec is tested against a stand-in built from the libraries
// the real components use — k8s.io/apiserver's StreamTranslatorHandler
// (kube-apiserver's WebSocket-to-SPDY translation for pods/exec) in front
// of k8s.io/cri-streaming's ServeExec (the kubelet's streaming server) —
// over both WebSocket and SPDY, with commands running as host processes;
// against the real API server, exec is only shown to be authorized by the
// RBAC manifest (it then fails: kwok's node has no kubelet to stream
// from). The exec wrapper and kill scripts assume a POSIX sh, kill and
// /proc in the cell image; a process that detaches from the command's
// process tree (double fork) survives a timeout until the cell is
// destroyed.
package kubernetes
