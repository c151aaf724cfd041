package cloudflare

import (
	"fmt"
	"io"
	"os"
)

// readSmallFile reads at most limit bytes of a regular file.
func readSmallFile(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("not a regular file")
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}
