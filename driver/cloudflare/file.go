package cloudflare

import (
	"fmt"
	"io"
	"os"
)

// readSmallFile reads at most limit bytes of a regular file; private
// refuses a file that its group or others may read or write.
func readSmallFile(path string, limit int64, private bool) ([]byte, error) {
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
	if private && st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("mode %04o: group and others must have no access (chmod 600)", st.Mode().Perm())
	}
	if st.Size() > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}
