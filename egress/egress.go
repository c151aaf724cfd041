// Package egress implements the egress policy form of CONTRACT §22: a list
// of host[:port] entries parsed into its canonical form, the egress_digest
// of that form, the subset rule by which a pool's policy covers a claim's,
// and the question a gateway asks of a policy (may this cell reach this name
// on this port?). Of this module it imports only package errcode.
//
// The contract leaves some of the entry syntax open; this package decides
// it as follows, and Parse refuses everything else with invalid_request.
//
//   - An entry is host or host:port, with no whitespace or control
//     character anywhere (nothing is trimmed). A list holds at most
//     [MaxEntries] entries as given; an empty list is the policy none.
//   - A host is a DNS name in ASCII: ASCII letters are lowered, one
//     trailing dot is removed, and then it must be at most 253 bytes of at
//     least two labels, each 1–63 bytes of letters, digits and hyphens, not
//     starting or ending with a hyphen. An internationalised name is given
//     as its A-label (xn--…); an underscore is refused. A single-label name
//     (localhost, metadata) is refused: the gateway would resolve it through
//     search domains, so its meaning would depend on the resolver.
//   - IP literals are refused (§22 forwards only names): IPv4, IPv6
//     (bracketed or not, with or without a zone), and any name whose last
//     label is a number (all digits, or 0x followed by hex digits), which
//     resolvers and URL parsers read as an IPv4 address (127.1, 0x7f.1).
//   - A wildcard is exactly a leading "*." followed by a host valid by the
//     rules above, so it names at least two labels: *.com, which would
//     admit a whole top-level domain, is refused, and so are *, *.*.test,
//     a.*.test and *a.test. *.files.test matches every name of at least
//     one more label that ends in .files.test (a.files.test,
//     a.b.files.test), never files.test itself.
//   - A port is 1 to 65535 in ASCII decimal digits, without a sign or a
//     leading zero. An entry without one means 443 and 80.
package egress

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/sandboxwich/sandboxwich/errcode"
)

// MaxEntries is the most entries a list may hold, counted as given (before
// an entry without a port becomes two).
const MaxEntries = 256

// Limits of a DNS name (RFC 1035 §2.3.4), without the trailing dot.
const (
	maxLabel = 63
	maxName  = 253
)

// Entry is one canonical entry of a policy: Host is lower case without a
// trailing dot, either an exact DNS name or "*." followed by one; Port is
// 1 to 65535.
type Entry struct {
	Host string
	Port uint16
}

// String returns the entry as it appears in the canonical form, host:port.
func (e Entry) String() string {
	return e.Host + ":" + strconv.FormatUint(uint64(e.Port), 10)
}

// matches reports whether e admits the canonical name host on port: the
// same port, and host equal to e.Host or, for a wildcard entry, ending in
// e.Host without its "*" after at least one more label. host may itself be
// a wildcard ("*.a.files.test" is matched by "*.files.test": every name it
// admits, the pool entry admits too).
func (e Entry) matches(host string, port uint16) bool {
	if e.Port != port {
		return false
	}
	if e.Host == host {
		return true
	}
	suffix, wild := strings.CutPrefix(e.Host, "*")
	return wild && len(host) > len(suffix) && strings.HasSuffix(host, suffix)
}

// Policy is a canonical egress policy: its entries sorted bytewise by their
// host:port string, without duplicates. The zero Policy is none, the policy
// that allows nothing (only loopback exists in the cell).
type Policy struct {
	entries []Entry
}

// None is the policy that allows nothing: the zero Policy. Its canonical
// form is the literal "none".
var None Policy

// Parse parses a list of host[:port] entries (CONTRACT §22, and the rules
// of the package documentation) into its canonical policy: every entry
// without a port becomes two, :443 and :80; the entries are sorted bytewise
// by their host:port string and duplicates removed. An empty or nil list is
// [None]. A malformed list is an [errcode.InvalidRequest] error whose
// message names the first bad entry by its index and its text.
func Parse(entries []string) (Policy, error) {
	if len(entries) > MaxEntries {
		return Policy{}, errcode.New(errcode.InvalidRequest,
			fmt.Sprintf("egress has %d entries; at most %d are allowed", len(entries), MaxEntries))
	}
	if len(entries) == 0 {
		return Policy{}, nil
	}
	out := make([]Entry, 0, 2*len(entries))
	for i, s := range entries {
		host, port, reason := parseEntry(s)
		if reason != "" {
			return Policy{}, errcode.New(errcode.InvalidRequest,
				fmt.Sprintf("egress[%d] %s: %s", i, quote(s), reason))
		}
		if port == 0 {
			out = append(out, Entry{host, 443}, Entry{host, 80})
		} else {
			out = append(out, Entry{host, port})
		}
	}
	return Policy{entries: canonicalOrder(out)}, nil
}

// canonicalOrder sorts es bytewise by their host:port strings and removes
// duplicates.
func canonicalOrder(es []Entry) []Entry {
	type keyed struct {
		key string
		e   Entry
	}
	ks := make([]keyed, len(es))
	for i, e := range es {
		ks[i] = keyed{e.String(), e}
	}
	slices.SortFunc(ks, func(a, b keyed) int { return strings.Compare(a.key, b.key) })
	ks = slices.CompactFunc(ks, func(a, b keyed) bool { return a.key == b.key })
	out := make([]Entry, len(ks))
	for i, k := range ks {
		out[i] = k.e
	}
	return out
}

// quote returns s quoted for an error message, cut to its first 100 bytes.
func quote(s string) string {
	const most = 100
	if len(s) > most {
		return strconv.Quote(s[:most]) + "…"
	}
	return strconv.Quote(s)
}

// parseEntry parses one host[:port] entry into its canonical host and its
// port, 0 when the entry has none. A non-empty reason says why the entry is
// refused.
func parseEntry(s string) (host string, port uint16, reason string) {
	if s == "" {
		return "", 0, "an entry is empty"
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c == 0x7f {
			return "", 0, "an entry holds no whitespace or control character"
		}
	}
	if strings.HasPrefix(s, "[") {
		if inner, _, ok := strings.Cut(s[1:], "]"); ok && isIP(inner) {
			return "", 0, "an IP literal is not allowed; name the host"
		}
		return "", 0, "not a DNS name"
	}
	if strings.Count(s, ":") > 1 {
		if isIP(s) {
			return "", 0, "an IP literal is not allowed; name the host"
		}
		return "", 0, "more than one ':'"
	}
	h, p, hasPort := strings.Cut(s, ":")
	if hasPort {
		n, ok := parsePort(p)
		if !ok {
			return "", 0, "the port is not a decimal number from 1 to 65535 (without a sign or leading zero)"
		}
		port = n
	}
	host, reason = canonicalHost(h, true)
	return host, port, reason
}

// parsePort parses a port of 1 to 65535 in ASCII decimal digits without a
// sign or a leading zero.
func parsePort(p string) (uint16, bool) {
	if len(p) == 0 || len(p) > 5 || p[0] == '0' {
		return 0, false
	}
	n := 0
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n > 65535 {
		return 0, false
	}
	return uint16(n), true
}

// isIP reports whether s is an IP address (v4, or v6 with or without a
// zone).
func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

// canonicalHost returns h lowered, without one trailing dot, if it is a
// valid host (or, when wildcard is true, a valid "*." wildcard); otherwise
// a non-empty reason.
func canonicalHost(h string, wildcard bool) (string, string) {
	for i := 0; i < len(h); i++ {
		if h[i] >= 0x80 {
			return "", "not an ASCII DNS name (write an internationalised name as its xn-- A-label)"
		}
	}
	h = strings.ToLower(h)
	h = strings.TrimSuffix(h, ".")
	if h == "" {
		return "", "the host is empty"
	}
	if isIP(h) {
		return "", "an IP literal is not allowed; name the host"
	}
	if len(h) > maxName {
		return "", fmt.Sprintf("the host is longer than %d bytes", maxName)
	}
	name := h
	if strings.Contains(h, "*") {
		if !wildcard {
			return "", "a wildcard is not a name"
		}
		rest, ok := strings.CutPrefix(h, "*.")
		if !ok || strings.Contains(rest, "*") {
			return "", `a wildcard is only a leading "*." before a name`
		}
		name = rest
	}
	if reason := checkName(name, name != h); reason != "" {
		return "", reason
	}
	return h, ""
}

// checkName returns why name (lower case, without a trailing dot) is not a
// valid exact host, or a valid wildcard's suffix when wild is true; or "".
func checkName(name string, wild bool) string {
	labels := strings.Split(name, ".")
	for _, l := range labels {
		switch {
		case l == "":
			return "a label is empty"
		case len(l) > maxLabel:
			return fmt.Sprintf("a label is longer than %d bytes", maxLabel)
		case l[0] == '-' || l[len(l)-1] == '-':
			return "a label starts or ends with a hyphen"
		}
		for i := 0; i < len(l); i++ {
			if c := l[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Sprintf("%q is not a letter, digit or hyphen", rune(c))
			}
		}
	}
	switch {
	case len(labels) < 2 && wild:
		return "a wildcard's suffix needs at least two labels (it would admit a whole top-level domain)"
	case len(labels) < 2:
		return "a name of one label is not allowed (it would be resolved through search domains)"
	case numeric(labels[len(labels)-1]):
		return "a name whose last label is a number reads as an IP literal, which is not allowed"
	}
	return ""
}

// numeric reports whether the label l reads as a number to an IPv4 parser:
// all decimal digits, or 0x followed by hex digits (possibly none).
func numeric(l string) bool {
	digits, base := l, "0123456789"
	if rest, ok := strings.CutPrefix(l, "0x"); ok {
		digits, base = rest, "0123456789abcdef"
		if digits == "" {
			return true
		}
	}
	for i := 0; i < len(digits); i++ {
		if !strings.ContainsRune(base, rune(digits[i])) {
			return false
		}
	}
	return true
}

// Entries returns a copy of the policy's canonical entries, in canonical
// order; none for [None].
func (p Policy) Entries() []Entry { return slices.Clone(p.entries) }

// IsNone reports whether p allows nothing.
func (p Policy) IsNone() bool { return len(p.entries) == 0 }

// Canonical returns the canonical form of CONTRACT §22: the entries as
// host:port joined by a newline (0x0A), or the literal "none" for [None].
func (p Policy) Canonical() string {
	if p.IsNone() {
		return "none"
	}
	var b strings.Builder
	for i, e := range p.entries {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.String())
	}
	return b.String()
}

// FenceString returns the claim's egress as fence digest v2 covers it
// (CONTRACT §21) when the claim carries this policy as its egress: its
// canonical form, except the empty string for an empty list. A claim
// without egress passes no string at all (fence.ClaimRequest.Egress nil).
func (p Policy) FenceString() string {
	if p.IsNone() {
		return ""
	}
	return p.Canonical()
}

// Digest returns the egress_digest of CONTRACT §22: the lowercase hex
// SHA-256 of the canonical form.
func (p Policy) Digest() string { return DigestOf(p.Canonical()) }

// DigestOf returns the egress_digest of a policy's canonical form, as
// stored (CONTRACT §22).
func DigestOf(canonical string) string {
	sum := sha256.Sum256([]byte(canonical))
	return hex.EncodeToString(sum[:])
}

// Covers reports whether claim is a subset of p (CONTRACT §22): each of the
// claim's entries equals an entry of p or is matched by a wildcard entry of
// p with the same port. A claim wildcard is covered by an equal one or by a
// wider one (*.a.files.test by *.files.test), never by exact names. [None]
// is covered by every policy.
func (p Policy) Covers(claim Policy) bool {
	for _, c := range claim.entries {
		if !p.admits(c.Host, c.Port) {
			return false
		}
	}
	return true
}

// Allows reports whether p lets a cell reach host on port: host (a name
// without a port, of any case, with or without a trailing dot) equals an
// entry's host, or is matched by a wildcard entry, on the same port.
// Anything that is not a valid exact name by the rules of Parse (an IP
// literal, a wildcard, a single label) is never allowed.
func (p Policy) Allows(host string, port uint16) bool {
	if p.IsNone() || port == 0 {
		return false
	}
	h, reason := canonicalHost(host, false)
	return reason == "" && p.admits(h, port)
}

// AllowsName reports whether p lets a cell reach host on some port: what a
// gateway asks before it answers a DNS query for host.
func (p Policy) AllowsName(host string) bool {
	h, reason := canonicalHost(host, false)
	if reason != "" {
		return false
	}
	for _, e := range p.entries {
		if e.matches(h, e.Port) {
			return true
		}
	}
	return false
}

// admits reports whether an entry of p matches the canonical host on port.
func (p Policy) admits(host string, port uint16) bool {
	for _, e := range p.entries {
		if e.matches(host, port) {
			return true
		}
	}
	return false
}
