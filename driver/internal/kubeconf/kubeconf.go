// Package kubeconf holds the configuration helpers the Kubernetes-based
// drivers share: loading a REST config and naming label values.
package kubeconf

import (
	"strings"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// RESTConfig loads the kubeconfig at path, or the in-cluster config of the
// Pod's ServiceAccount when path is empty.
func RESTConfig(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	return rest.InClusterConfig()
}

// LabelValue maps a pool name to a label value: characters a label value
// cannot hold become "-", and the ends are trimmed to alphanumerics. It
// does not shorten names over 63 characters (the drivers refuse them).
func LabelValue(name string) string {
	v := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '.':
			return r
		}
		return '-'
	}, name)
	return strings.Trim(v, "-_.")
}
