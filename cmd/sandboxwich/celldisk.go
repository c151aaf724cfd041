package main

import (
	"fmt"
	"maps"
	"strconv"
)

// cellDiskKey is the pool key of a cell's writable storage (CONTRACT §25),
// and the provider setting its value is passed in.
const cellDiskKey = "cell_disk_bytes"

// diskProviders are the providers that bound a cell's writable storage:
// each takes the pool key cell_disk_bytes as its setting of the same
// name, checks it against the cell's memory (a value not below it stops
// start-up, naming the key) and defaults it to half that memory.
var diskProviders = map[string]bool{"gvisor": true, "kubernetes": true}

// checkCellDisk checks a pool's key cell_disk_bytes as far as the
// configuration alone can: a positive number, of a provider that bounds a
// cell's storage. A provider setting of the same name (e.g.
// SANDBOXWICH_GVISOR_CELL_DISK_BYTES) is the pool key all the same.
func checkCellDisk(p *poolConfig) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("invalid pool %q: key %s (SANDBOXWICH_STERILE_POOL_CELL_DISK_BYTES for the environment's pool): %s",
			p.Name, cellDiskKey, fmt.Sprintf(format, args...))
	}
	if v := p.Settings[cellDiskKey]; v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		switch {
		case err != nil || n <= 0:
			return bad("%q is not a positive number of bytes", v)
		case p.CellDiskBytes != 0 && p.CellDiskBytes != n:
			return bad("%d differs from the provider setting %s (%d)", p.CellDiskBytes, cellDiskKey, n)
		}
		p.CellDiskBytes = n
	}
	switch {
	case p.CellDiskBytes < 0:
		return bad("%d is not a positive number of bytes", p.CellDiskBytes)
	case p.CellDiskBytes > 0 && !diskProviders[p.Provider]:
		return bad("provider %s does not bound a cell's storage (gvisor and kubernetes do)", p.Provider)
	}
	return nil
}

// withCellDisk returns the settings a pool's provider is built with: its
// own, plus the pool key cell_disk_bytes when set.
func withCellDisk(p poolConfig, settings map[string]string) (map[string]string, error) {
	if err := checkCellDisk(&p); err != nil {
		return nil, err
	}
	if p.CellDiskBytes == 0 {
		return settings, nil
	}
	settings = maps.Clone(settings)
	if settings == nil {
		settings = map[string]string{}
	}
	settings[cellDiskKey] = strconv.FormatInt(p.CellDiskBytes, 10)
	return settings, nil
}
