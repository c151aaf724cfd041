// The Pods' sandbox ("pause") container of internal/k8stest's real node,
// built by scripts/k8s-binaries.sh. Standard library only.
module sandboxwich.local/k8s/pause

go 1.26.0
