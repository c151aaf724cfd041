// Package hostile holds only tests: hostile HTTP requests and security
// checks against the real sandboxwich binary (built from cmd/sandboxwich
// and started as a subprocess, configured like an operator would: a key
// file, a config file, a SQLite database and a dry-run pool).
//
//   - TestHostile…: a table of hostile requests (oversize bodies and
//     headers, wrong types, NUL bytes and unicode look-alikes in
//     identifiers, path tricks in IDs, duplicate JSON keys, request
//     smuggling, bad tokens and keys), each answered with its status and
//     error code and proven to change no state; slow clients cut off by the
//     server's read-header, read and idle timeouts.
//   - TestSecurity…: cross-tenant access indistinguishable from not-found;
//     no token, attestation or key in any database column, log line, or the
//     server's argv and environment after a full run; the signing-key file
//     rules enforced at start-up; tokens compared in constant time; TLS.
package hostile
