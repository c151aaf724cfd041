package attest

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"unicode/utf8"
)

const (
	minKeySize = 32   // bytes of key, after trimming
	maxKeySize = 4096 // bytes of key file
)

// Errors of [NewKeyring] and [LoadKeyFile], which wrap them with details.
// No error message of this package contains key bytes.
var (
	// ErrKeyTooShort means the key has fewer than 32 bytes.
	ErrKeyTooShort = errors.New("attest: signing key too short (minimum 32 bytes)")
	// ErrKeyTooLong means the key, or the key file, has more than 4096 bytes.
	ErrKeyTooLong = errors.New("attest: signing key too long (limit 4096 bytes)")
	// ErrKeyFileMode means group or others may read or write the key file.
	ErrKeyFileMode = errors.New("attest: signing key file is accessible by group or others")
)

// LoadKeyFile returns a Keyring for the key in the file at path, following
// CONTRACT.md 3.1: the file must be a regular file of at most 4096 bytes
// that neither group nor others may access (such as mode 0600 or 0400); its content
// must be UTF-8 text, and the key is that text with surrounding white space
// trimmed, at least 32 bytes long.
//
// Errors wrap [ErrKeyFileMode], [ErrKeyTooLong], [ErrKeyTooShort] or the
// error of opening or reading the file, and name the path.
func LoadKeyFile(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("attest: load signing key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("attest: load signing key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("attest: signing key file %s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o; fix it with: chmod 600 %s", ErrKeyFileMode, path, perm, path)
	}
	// Read into one buffer, cleared afterwards, and at most one byte past the
	// limit however large the file is.
	buf := make([]byte, maxKeySize+1)
	defer clear(buf)
	n, err := io.ReadFull(f, buf)
	switch {
	case err == nil:
		return nil, fmt.Errorf("%w: key file %s is larger", ErrKeyTooLong, path)
	case err != io.EOF && err != io.ErrUnexpectedEOF:
		return nil, fmt.Errorf("attest: load signing key: %w", err)
	}
	data := buf[:n]
	if !utf8.Valid(data) {
		return nil, fmt.Errorf("attest: signing key file %s is not valid UTF-8 text", path)
	}
	// bytes.TrimSpace trims exactly what strings.TrimSpace would, without
	// making an immutable string copy of the key.
	key := bytes.TrimSpace(data)
	if len(key) < minKeySize {
		return nil, fmt.Errorf("%w: key file %s holds %d bytes after trimming white space", ErrKeyTooShort, path, len(key))
	}
	return NewKeyring(key)
}

// GenerateKeyFile creates a new file at path, with mode 0600 (less the umask),
// holding a fresh random key: 64 lowercase hex characters (256 bits from
// crypto/rand) and a newline. It refuses to replace an existing file or to
// follow a symbolic link at path; the error then matches [io/fs.ErrExist].
func GenerateKeyFile(path string) error {
	var raw [32]byte
	rand.Read(raw[:]) // never fails since Go 1.24
	var text [2*len(raw) + 1]byte
	hex.Encode(text[:], raw[:])
	text[len(text)-1] = '\n'
	defer clear(raw[:])
	defer clear(text[:])

	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("attest: generate signing key: %w", err)
	}
	_, err = f.Write(text[:])
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path) // created above, so it is ours
		return fmt.Errorf("attest: generate signing key: %w", err)
	}
	return nil
}
