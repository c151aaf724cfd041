package agentsandbox

import (
	"strings"

	"k8s.io/apimachinery/pkg/types"
)

// ref names one object of the chain a member is bound to: its name and
// UID. An object is absent when its name is not found or now belongs to
// another UID.
type ref struct {
	Name string
	UID  types.UID
}

func (r ref) String() string {
	if r.UID == "" {
		return ""
	}
	return r.Name + "/" + string(r.UID)
}

func (r ref) empty() bool { return r.UID == "" }

// identity is what a member is bound to: the SandboxClaim's UID and the
// Sandbox and Pod (name and UID) the claim resolved to at binding.
type identity struct {
	Claim   types.UID
	Sandbox ref
	Pod     ref
}

// String encodes the identity as
// "claim=<uid>,sandbox=<name>/<uid>,pod=<name>/<uid>"; parts not (yet)
// known are left out.
func (id identity) String() string {
	var parts []string
	if id.Claim != "" {
		parts = append(parts, "claim="+string(id.Claim))
	}
	if !id.Sandbox.empty() {
		parts = append(parts, "sandbox="+id.Sandbox.String())
	}
	if !id.Pod.empty() {
		parts = append(parts, "pod="+id.Pod.String())
	}
	return strings.Join(parts, ",")
}

// complete reports that all three objects are known.
func (id identity) complete() bool {
	return id.Claim != "" && !id.Sandbox.empty() && !id.Pod.empty()
}

// parseIdentity decodes String's encoding. ok is false when s is not
// one; an identity this driver did not produce names no object of its own.
func parseIdentity(s string) (id identity, ok bool) {
	if s == "" {
		return id, true
	}
	for part := range strings.SplitSeq(s, ",") {
		key, val, found := strings.Cut(part, "=")
		if !found || val == "" {
			return identity{}, false
		}
		switch key {
		case "claim":
			if id.Claim != "" {
				return identity{}, false
			}
			id.Claim = types.UID(val)
		case "sandbox", "pod":
			name, uid, found := strings.Cut(val, "/")
			if !found || name == "" || uid == "" {
				return identity{}, false
			}
			r := ref{Name: name, UID: types.UID(uid)}
			dst := &id.Sandbox
			if key == "pod" {
				dst = &id.Pod
			}
			if !dst.empty() {
				return identity{}, false
			}
			*dst = r
		default:
			return identity{}, false
		}
	}
	if id.Claim == "" {
		return identity{}, false
	}
	return id, true
}
