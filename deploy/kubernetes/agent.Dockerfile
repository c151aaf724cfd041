# The cell agent's image for the Kubernetes driver's agent_image
# (SANDBOXWICH_KUBERNETES_AGENT_IMAGE): the static agent alone, at
# /sandboxwich-agent, on an empty base. Each cell Pod's init container runs
# `/sandboxwich-agent -install /sbw/bin/sandboxwich-agent` from it, and the
# cell container starts the copy as its entrypoint. Build it from the
# repository root, push it, and pin the pushed digest in agent_image:
#
#   docker build --platform linux/amd64 -f deploy/kubernetes/agent.Dockerfile \
#     --build-arg GO_IMAGE=golang:1.26-bookworm@sha256:<digest> \
#     -t registry.example/sandboxwich-agent .
#   docker push registry.example/sandboxwich-agent   # prints the digest
#
# The plane expects the digest the kubelet reports for the init container
# (its imageID's repo digest): an image imported into a node without a
# registry must be imported under its digest reference, or it reports none.

ARG GO_IMAGE

FROM ${GO_IMAGE} AS build
ARG GO_IMAGE
RUN case "$GO_IMAGE" in *@sha256:*) ;; *) echo "GO_IMAGE must be pinned by digest" >&2; exit 1;; esac
WORKDIR /src
COPY go.mod go.sum ./
COPY agent ./agent
COPY cmd/sandboxwich-agent ./cmd/sandboxwich-agent
RUN CGO_ENABLED=0 GOFLAGS=-mod=mod go build -trimpath -ldflags='-s -w' -o /out/sandboxwich-agent ./cmd/sandboxwich-agent

FROM scratch
COPY --from=build /out/sandboxwich-agent /sandboxwich-agent
USER 1000:1000
ENTRYPOINT ["/sandboxwich-agent"]
