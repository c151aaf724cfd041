package reliability

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Cluster is a private PostgreSQL cluster of one check: its own data
// directory and port on 127.0.0.1, so that stopping and restarting it
// touches no other user of the machine's test server.
type Cluster struct {
	// URL is the connection URL of the cluster's database "rel".
	URL    string
	dir    string
	port   int
	bindir string
	owner  []string // runuser -u postgres -- when running as root
	listen []string // addresses beside 127.0.0.1
}

// StartCluster creates and starts a cluster under a new directory of
// os.TempDir() (PostgreSQL refuses to run as root, so as root the cluster
// belongs to the user postgres, and its directory must be one that user
// can reach). It listens on 127.0.0.1 and on the addresses of listen, and
// lets user postgres in without a password from 127.0.0.1 and from the
// networks of trust (CIDR).
func StartCluster(ctx context.Context, listen, trust []string) (*Cluster, error) {
	bins, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(bins) == 0 {
		return nil, fmt.Errorf("no PostgreSQL server binaries (scripts/start-postgres.sh installs them)")
	}
	sort.Strings(bins)
	c := &Cluster{bindir: filepath.Dir(bins[len(bins)-1]), listen: listen}
	dir, err := os.MkdirTemp("", "sbw-rel-pg-")
	if err != nil {
		return nil, err
	}
	c.dir = dir
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, fmt.Errorf("running as root needs the user postgres: %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		c.owner = []string{"runuser", "-u", "postgres", "--"}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	c.port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if out, err := c.run(ctx, "initdb", "-D", c.data(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8"); err != nil {
		c.Remove()
		return nil, fmt.Errorf("initdb: %w: %s", err, out)
	}
	if len(trust) > 0 {
		hba, err := os.OpenFile(filepath.Join(c.data(), "pg_hba.conf"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			c.Remove()
			return nil, err
		}
		for _, n := range trust {
			fmt.Fprintf(hba, "host all postgres %s trust\n", n)
		}
		if err := hba.Close(); err != nil {
			c.Remove()
			return nil, err
		}
	}
	if err := c.Start(ctx); err != nil {
		c.Remove()
		return nil, err
	}
	if out, err := exec.CommandContext(ctx, filepath.Join(c.bindir, "psql"), c.admin(), "-qc", "CREATE DATABASE rel").CombinedOutput(); err != nil {
		c.Remove()
		return nil, fmt.Errorf("create database: %w: %s", err, out)
	}
	c.URL = c.URLAt("127.0.0.1")
	return c, nil
}

// URLAt is the URL of the database "rel" through the address host.
func (c *Cluster) URLAt(host string) string {
	return fmt.Sprintf("postgres://postgres@%s/rel?sslmode=disable", net.JoinHostPort(host, strconv.Itoa(c.port)))
}

func (c *Cluster) data() string { return filepath.Join(c.dir, "data") }
func (c *Cluster) log() string  { return filepath.Join(c.dir, "postgres.log") }

// opts are the server's options: loopback only, the socket in the
// cluster's directory.
func (c *Cluster) opts() string {
	return fmt.Sprintf("-c listen_addresses=%s -p %d -k %s -c max_connections=200",
		strings.Join(append([]string{"127.0.0.1"}, c.listen...), ","), c.port, c.dir)
}
func (c *Cluster) admin() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)
}

func (c *Cluster) run(ctx context.Context, prog string, args ...string) (string, error) {
	argv := append(append([]string(nil), c.owner...), filepath.Join(c.bindir, prog))
	cmd := exec.CommandContext(ctx, argv[0], append(argv[1:], args...)...)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// Start starts the cluster and waits until it accepts connections.
func (c *Cluster) Start(ctx context.Context) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.data(), "-l", c.log(), "-w", "-t", "60", "-o", c.opts(), "start"); err != nil {
		return fmt.Errorf("pg_ctl start: %w: %s", err, out)
	}
	return nil
}

// Stop stops the cluster with pg_ctl's shutdown mode ("fast" rolls back
// open transactions and disconnects; "immediate" aborts without a
// checkpoint, as a crash would, and the next start recovers from the WAL).
func (c *Cluster) Stop(ctx context.Context, mode string) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.data(), "-w", "-t", "60", "-m", mode, "stop"); err != nil {
		return fmt.Errorf("pg_ctl stop -m %s: %w: %s", mode, err, out)
	}
	return nil
}

// Restart is pg_ctl restart with mode.
func (c *Cluster) Restart(ctx context.Context, mode string) error {
	if out, err := c.run(ctx, "pg_ctl", "-D", c.data(), "-l", c.log(), "-w", "-t", "60", "-m", mode, "-o", c.opts(), "restart"); err != nil {
		return fmt.Errorf("pg_ctl restart -m %s: %w: %s", mode, err, out)
	}
	return nil
}

// Accepting reports whether the cluster answers a query now.
func (c *Cluster) Accepting(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	return exec.CommandContext(ctx, filepath.Join(c.bindir, "pg_isready"), "-h", "127.0.0.1", "-p", strconv.Itoa(c.port), "-q").Run() == nil
}

// Remove stops the cluster (immediately) and deletes its directory.
func (c *Cluster) Remove() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := os.Stat(filepath.Join(c.data(), "postmaster.pid")); err == nil {
		_ = c.Stop(ctx, "immediate")
	}
	_ = os.RemoveAll(c.dir)
}
