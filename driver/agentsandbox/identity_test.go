package agentsandbox

import "testing"

func TestIdentityRoundTrip(t *testing.T) {
	full := identity{Claim: "c1", Sandbox: ref{"sbx", "s1"}, Pod: ref{"pod", "p1"}}
	for _, id := range []identity{full, {Claim: "c1"}, {Claim: "c1", Sandbox: ref{"sbx", "s1"}}} {
		got, ok := parseIdentity(id.String())
		if !ok || got != id {
			t.Errorf("parseIdentity(%q) = %+v, %v; want %+v", id.String(), got, ok, id)
		}
	}
	if s := full.String(); s != "claim=c1,sandbox=sbx/s1,pod=pod/p1" {
		t.Errorf("String = %q", s)
	}
	for _, bad := range []string{"never-created", "pod=a/b", "claim=", "claim=a,claim=b", "claim=a,pod=nouid", "claim=a,x=y"} {
		if _, ok := parseIdentity(bad); ok {
			t.Errorf("parseIdentity(%q) accepted", bad)
		}
	}
}
