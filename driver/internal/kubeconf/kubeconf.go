// Package kubeconf holds the configuration helpers the Kubernetes-based
// drivers share: loading a REST config and naming label values.
package kubeconf

import (
	"errors"
	"fmt"
	"strings"

	"github.com/sandboxwich/sandboxwich/lease"
	"k8s.io/apimachinery/pkg/util/validation"
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

// RuntimeClassIndex checks a class → RuntimeClass name mapping and returns
// its inverse, by which verification maps an admitted Pod's
// runtimeClassName back to a class. Two classes sharing one name could not
// be told apart, so that is refused.
func RuntimeClassIndex(names map[lease.RuntimeClass]string) (map[string]lease.RuntimeClass, error) {
	if len(names) == 0 {
		return nil, errors.New("must map at least one runtime class")
	}
	byName := map[string]lease.RuntimeClass{}
	for class, name := range names {
		if !class.Valid() {
			return nil, fmt.Errorf("names an undefined class %q", class)
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			return nil, fmt.Errorf("%s → %q is not a valid RuntimeClass name", class, name)
		}
		if other, dup := byName[name]; dup {
			return nil, fmt.Errorf("maps both %s and %s to %q: verification could not tell them apart", other, class, name)
		}
		byName[name] = class
	}
	return byName, nil
}
