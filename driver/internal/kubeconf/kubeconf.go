// Package kubeconf holds what the Kubernetes-based drivers share besides
// exec: loading a REST config, parsing settings, the ownership labels and
// label values, and Pod readiness.
package kubeconf

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandboxwich/sandboxwich/lease"
	corev1 "k8s.io/api/core/v1"
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

// Ownership labels both drivers put on the objects they create, and read
// back to find them.
const (
	// LabelManagedBy marks every object a driver creates.
	LabelManagedBy = "app.kubernetes.io/managed-by"
	// ManagedByValue is LabelManagedBy's value.
	ManagedByValue = "sandboxwich"
	// LabelPool carries the pool's label value: the label List selects on.
	LabelPool = "sandboxwich.dev/pool"
	// LabelInstallation carries the plane's installation tag
	// (driver.InstallationTag): List selects on it with the pool's label,
	// so planes sharing a namespace never list each other's objects.
	LabelInstallation = "sandboxwich.dev/installation"
	// LabelCellID carries the cell ID an object backs.
	LabelCellID = "sandboxwich.dev/cell-id"
	// LabelRuntimeClass records the class an object was requested for. It
	// is bookkeeping, never evidence: verification reads the admitted
	// Pod's spec.runtimeClassName.
	LabelRuntimeClass = "sandboxwich.dev/runtime-class"
)

// PodReady reports Running, not terminating, every container ready.
func PodReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.Phase != corev1.PodRunning {
		return false
	}
	if len(pod.Status.ContainerStatuses) < len(pod.Spec.Containers) {
		return false
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if !cs.Ready {
			return false
		}
	}
	return true
}

// Settings are one driver's string settings, as ConfigFromSettings takes
// them; Driver names the driver in errors.
type Settings struct {
	Driver string
	Known  []string
	Values map[string]string
}

// Check refuses a key outside Known, naming it.
func (s Settings) Check() error {
	for k := range s.Values {
		if !slices.Contains(s.Known, k) {
			return fmt.Errorf("%s: unknown setting %q (known: %s)", s.Driver, k, strings.Join(s.Known, ", "))
		}
	}
	return nil
}

// RESTConfig loads the config the kubeconfig setting names.
func (s Settings) RESTConfig() (*rest.Config, error) {
	c, err := RESTConfig(s.Values["kubeconfig"])
	if err != nil {
		return nil, fmt.Errorf("%s: setting kubeconfig: %w", s.Driver, err)
	}
	return c, nil
}

// RuntimeClassNames reads the runtime_class_<class> settings.
func (s Settings) RuntimeClassNames() map[lease.RuntimeClass]string {
	out := map[lease.RuntimeClass]string{}
	for _, class := range []lease.RuntimeClass{lease.GVisorLowerRisk, lease.KataMicroVM} {
		if name := s.Values["runtime_class_"+string(class)]; name != "" {
			out[class] = name
		}
	}
	return out
}

// Millis parses the settings named by dst's keys, positive numbers of
// milliseconds, into the durations dst points at; absent ones are left.
func (s Settings) Millis(dst map[string]*time.Duration) error {
	for key, d := range dst {
		if v := s.Values[key]; v != "" {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n <= 0 {
				return fmt.Errorf("%s: setting %s: %q is not a positive number of milliseconds", s.Driver, key, v)
			}
			*d = time.Duration(n) * time.Millisecond
		}
	}
	return nil
}

// PoolLabel is the pool_label setting, or else pool as a label value.
func (s Settings) PoolLabel(pool string) string {
	if v := s.Values["pool_label"]; v != "" {
		return v
	}
	return LabelValue(pool)
}
