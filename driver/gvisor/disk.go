package gvisor

import (
	"fmt"
	"strconv"
)

// MinCellDiskBytes is the smallest Config.CellDiskBytes: each writable
// place of a cell gets a whole number of pages of it.
const MinCellDiskBytes = 1 << 20

// pageSize is the unit gVisor's tmpfs sizes are counted in.
const pageSize = 4096

// CellDiskError is the error New returns for a Config.CellDiskBytes it
// refuses: negative, below MinCellDiskBytes, or not below the cell's
// memory (pool key cell_disk_bytes).
type CellDiskError struct {
	// Bytes is the refused value, MemoryLimitBytes the cell's memory.
	Bytes, MemoryLimitBytes int64
}

func (e *CellDiskError) Error() string {
	if e.Bytes >= e.MemoryLimitBytes {
		return fmt.Sprintf("gvisor: key cell_disk_bytes: %d is not below the cell's memory (memory_limit_bytes %d): "+
			"a cell's writable storage lives in its memory", e.Bytes, e.MemoryLimitBytes)
	}
	return fmt.Sprintf("gvisor: key cell_disk_bytes: %d is not a number of bytes from %d to below the cell's memory (%d)",
		e.Bytes, MinCellDiskBytes, e.MemoryLimitBytes)
}

// defaultCellDisk fills in and checks CellDiskBytes; MemoryLimitBytes is
// already filled in.
func (c *Config) defaultCellDisk() error {
	if c.CellDiskBytes == 0 {
		c.CellDiskBytes = c.MemoryLimitBytes / 2
	}
	if c.CellDiskBytes < MinCellDiskBytes || c.CellDiskBytes >= c.MemoryLimitBytes {
		return &CellDiskError{Bytes: c.CellDiskBytes, MemoryLimitBytes: c.MemoryLimitBytes}
	}
	return nil
}

// The writable places of a cell, each a file system of its own in the
// sandbox's memory.
const (
	diskRoot   = "/" // the root's upper layer, with an image only
	diskHome   = cellHome
	diskTmp    = "/tmp"
	diskVarTmp = "/var/tmp"
	diskShm    = "/dev/shm"
)

// diskShares splits a cell's writable storage of n bytes into the sizes
// of its writable file systems, in whole pages, which together make n
// rounded down to a page, in sixteenths (the table of "Disk" in the
// package documentation): /home/cell 6, /tmp 4, /var/tmp 4, /dev/shm 2;
// with an image, its root's writable layer 4, /home/cell 4, /tmp 3,
// /var/tmp 3, /dev/shm 2. (/var/tmp holds Inspect AI's sandbox tools,
// about 33 MB unpacked.) What the rounding leaves goes to /home/cell.
// gVisor's tmpfs bounds each on its own (there is no shared budget
// between file systems), and a write past one's size fails with ENOSPC
// in the cell; the cell, whose memory holds them all, lives.
func diskShares(n int64, image bool) map[string]int64 {
	pages := n / pageSize
	parts := map[string]int64{diskHome: 6, diskTmp: 4, diskVarTmp: 4, diskShm: 2}
	if image {
		parts = map[string]int64{diskRoot: 4, diskHome: 4, diskTmp: 3, diskVarTmp: 3, diskShm: 2}
	}
	shares := map[string]int64{}
	var used int64
	for place, part := range parts {
		shares[place] = pages * part / 16
		used += shares[place]
	}
	shares[diskHome] += pages - used
	for place := range shares {
		shares[place] *= pageSize
	}
	return shares
}

// sizeOption is the tmpfs mount option that bounds a file system to n
// bytes.
func sizeOption(n int64) string { return "size=" + strconv.FormatInt(n, 10) }
