package egress_test

import (
	"fmt"

	"github.com/sandboxwich/sandboxwich/egress"
)

// A pool allows pkgs.test (on 443 and 80) and every name under files.test
// on 8443; a claim narrows it to one host and port.
func Example() {
	pool, err := egress.Parse([]string{"PKGS.test.", "*.files.test:8443"})
	if err != nil {
		panic(err)
	}
	fmt.Println(pool.Canonical())
	fmt.Println(pool.Digest())

	claim, err := egress.Parse([]string{"a.files.test:8443"})
	if err != nil {
		panic(err)
	}
	fmt.Println(pool.Covers(claim), claim.Covers(pool))
	fmt.Println(pool.Allows("b.files.test", 8443), pool.Allows("files.test", 8443))

	_, err = egress.Parse([]string{"pkgs.test", "10.0.0.1:443"})
	fmt.Println(err)
	// Output:
	// *.files.test:8443
	// pkgs.test:443
	// pkgs.test:80
	// a519198c3dddcd86202ceffae15243aa45fc6968f788e231cba60d1ca134e330
	// true false
	// true false
	// invalid_request: egress[1] "10.0.0.1:443": an IP literal is not allowed; name the host
}
