package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/sandboxwich/sandboxwich/wire"
)

// MaxBodyBytes bounds every JSON request body but exec's (413
// payload_too_large beyond).
const MaxBodyBytes = 1 << 20

// MaxExecBodyBytes bounds an exec request body, so that stdin_base64 can
// carry the full 1 MiB of stdin (CONTRACT §14).
const MaxExecBodyBytes = 2 << 20

// readBody checks the content type (415) and reads at most limit bytes
// (413).
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if !jsonContentType(r.Header.Get("Content-Type")) {
		return nil, errMediaType
	}
	if r.ContentLength > limit {
		return nil, tooLarge("the request body", limit)
	}
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
		return nil, tooLarge("the request body", limit)
	}
	if err != nil {
		return nil, malformed("the request body could not be read")
	}
	return b, nil
}

// jsonContentType accepts application/json and application/*+json, with
// any parameters.
func jsonContentType(v string) bool {
	mt, _, err := mime.ParseMediaType(v)
	if err != nil && !errors.Is(err, mime.ErrInvalidMediaParameter) {
		return false
	}
	return mt == "application/json" || strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")
}

// pathUUID parses a UUID path segment (400 invalid_request otherwise).
func pathUUID(r *http.Request, name string) (uuid.UUID, error) {
	id, err := uuid.Parse(r.PathValue(name))
	if err != nil {
		return uuid.Nil, malformed(name + " must be a UUID")
	}
	return id, nil
}

// object reads a JSON object of a request body field by field, deciding
// "missing" by presence: an absent field and a field that is null are both
// missing. The first error is kept and shared with nested objects; reads
// after it return zero values. Unknown fields are ignored.
type object struct {
	fields map[string]json.RawMessage
	prefix string // "release." for the fields of a nested release
	err    *error
}

// parseObject parses a request body: malformed JSON is a 400, a value that
// is not an object a 422.
func parseObject(body []byte) (*object, error) {
	if !json.Valid(body) {
		return nil, malformed("the request body is not valid JSON")
	}
	var m map[string]json.RawMessage
	if t := bytes.TrimSpace(body); len(t) == 0 || t[0] != '{' || json.Unmarshal(t, &m) != nil {
		return nil, invalid("the request body must be a JSON object")
	}
	var err error
	return &object{fields: m, err: &err}, nil
}

// Err returns the first error of any read.
func (o *object) Err() error { return *o.err }

func (o *object) fail(name, msg string) {
	if *o.err == nil {
		*o.err = invalid(o.prefix + name + " " + msg)
	}
}

// value returns a field that is present and not null.
func (o *object) value(name string) (json.RawMessage, bool) {
	if *o.err != nil {
		return nil, false
	}
	v, ok := o.fields[name]
	if !ok || string(bytes.TrimSpace(v)) == "null" {
		return nil, false
	}
	return v, true
}

// required returns a field that must be present, failing otherwise.
func (o *object) required(name string) (json.RawMessage, bool) {
	v, ok := o.value(name)
	if !ok {
		o.fail(name, "is required")
	}
	return v, ok
}

// decodeInto unmarshals a present field, failing with msg.
func (o *object) decodeInto(name string, v json.RawMessage, dst any, msg string) bool {
	if err := json.Unmarshal(v, dst); err != nil {
		o.fail(name, msg)
		return false
	}
	return true
}

// str reads a required string.
func (o *object) str(name string) string {
	var s string
	if v, ok := o.required(name); ok {
		o.decodeInto(name, v, &s, "must be a string")
	}
	return s
}

// optStr reads an optional string ("" when missing).
func (o *object) optStr(name string) string {
	var s string
	if v, ok := o.value(name); ok {
		o.decodeInto(name, v, &s, "must be a string")
	}
	return s
}

// optStrPtr reads an optional string: nil when missing or null, so that
// an empty string is told from none.
func (o *object) optStrPtr(name string) *string {
	v, ok := o.value(name)
	if !ok {
		return nil
	}
	var s string
	o.decodeInto(name, v, &s, "must be a string")
	return &s
}

// uint reads a required unsigned integer.
func (o *object) uint(name string) uint64 {
	if v, ok := o.required(name); ok {
		return o.parseUint(name, v)
	}
	return 0
}

// optUint reads an optional unsigned integer.
func (o *object) optUint(name string) *uint64 {
	if v, ok := o.value(name); ok {
		n := o.parseUint(name, v)
		return &n
	}
	return nil
}

// parseUint accepts a JSON integer literal in [0, 2^64): no sign, fraction
// or exponent.
func (o *object) parseUint(name string, v json.RawMessage) uint64 {
	s := strings.TrimSpace(string(v))
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		o.fail(name, "must be a non-negative integer")
		return 0
	}
	return n
}

// uuid reads a required UUID in any common spelling.
func (o *object) uuid(name string) uuid.UUID {
	if v, ok := o.required(name); ok {
		return o.parseUUID(name, v)
	}
	return uuid.Nil
}

// optUUID reads an optional UUID.
func (o *object) optUUID(name string) *uuid.UUID {
	if v, ok := o.value(name); ok {
		id := o.parseUUID(name, v)
		return &id
	}
	return nil
}

func (o *object) parseUUID(name string, v json.RawMessage) uuid.UUID {
	var s string
	if !o.decodeInto(name, v, &s, "must be a UUID") {
		return uuid.Nil
	}
	id, err := uuid.Parse(s)
	if err != nil {
		o.fail(name, "must be a UUID")
	}
	return id
}

// enum reads a required string that must be one of allowed.
func (o *object) enum(name string, allowed ...string) string {
	v, ok := o.required(name)
	if !ok {
		return ""
	}
	var s string
	if json.Unmarshal(v, &s) == nil {
		for _, a := range allowed {
			if s == a {
				return s
			}
		}
	}
	o.fail(name, "must be one of "+strings.Join(allowed, ", "))
	return ""
}

// optEnum reads an optional string that must be one of allowed ("" when
// missing).
func (o *object) optEnum(name string, allowed ...string) string {
	if _, ok := o.value(name); ok {
		return o.enum(name, allowed...)
	}
	return ""
}

// timestamp reads a required RFC 3339 timestamp.
func (o *object) timestamp(name string) time.Time {
	var t wire.Time
	if v, ok := o.required(name); ok {
		o.decodeInto(name, v, &t, "must be an RFC 3339 timestamp")
	}
	return t.Time
}

// obj reads a required nested object (nil when missing or not an object).
func (o *object) obj(name string) *object {
	v, ok := o.required(name)
	if !ok {
		return nil
	}
	var m map[string]json.RawMessage
	if t := bytes.TrimSpace(v); t[0] != '{' || json.Unmarshal(t, &m) != nil {
		o.fail(name, "must be an object")
		return nil
	}
	return &object{fields: m, prefix: o.prefix + name + ".", err: o.err}
}

// strs reads a required array of strings.
func (o *object) strs(name string) []string {
	var s []string
	if v, ok := o.required(name); ok && o.decodeInto(name, v, &s, "must be an array of strings") && hasNull(v) {
		o.fail(name, "must be an array of strings")
	}
	return s
}

// optStrs reads an optional array of strings: nil when missing or null,
// so that an empty array is told from none.
func (o *object) optStrs(name string) *[]string {
	v, ok := o.value(name)
	if !ok {
		return nil
	}
	s := []string{}
	if o.decodeInto(name, v, &s, "must be an array of strings") && hasNull(v) {
		o.fail(name, "must be an array of strings")
	}
	return &s
}

// optStrMap reads an optional object of strings.
func (o *object) optStrMap(name string) map[string]string {
	var m map[string]string
	if v, ok := o.value(name); ok && o.decodeInto(name, v, &m, "must be an object of strings") && hasNull(v) {
		o.fail(name, "must be an object of strings")
	}
	return m
}

// hasNull reports whether a JSON array or object has a null element.
func hasNull(v json.RawMessage) bool {
	var elems []json.RawMessage
	if json.Unmarshal(v, &elems) != nil {
		var m map[string]json.RawMessage
		if json.Unmarshal(v, &m) != nil {
			return false
		}
		for _, e := range m {
			elems = append(elems, e)
		}
	}
	for _, e := range elems {
		if string(bytes.TrimSpace(e)) == "null" {
			return true
		}
	}
	return false
}
