package gvisor

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"

	"github.com/google/uuid"
	"golang.org/x/sys/unix"

	"github.com/sandboxwich/sandboxwich/driver"
	"github.com/sandboxwich/sandboxwich/egress"
	"github.com/sandboxwich/sandboxwich/egress/gateway"
)

// EgressNet gives gVisor cells an egress allow-list enforced outside them
// (CONTRACT §22). Each cell runs in a network namespace of its own whose
// one interface is a veth pair to the gateway's namespace, with a single
// route: to the gateway's address. The gateway's namespace holds nothing
// but that address and the gateway's sockets, and forwards nothing; the
// gateway (package egress/gateway) answers the cells' DNS queries for the
// names their policy allows, and proxies TLS and HTTP connections to those
// names from the host's namespace. Root in a cell cannot add a route
// (gVisor's netstack refuses it).
//
// One EgressNet serves every gVisor provider of a plane; each provider
// given one (Config.Egress) runs its cells with runsc --network=sandbox in
// the namespaces it makes. A namespace is named after its cell's address
// and made ahead of the provision that takes it (EgressConfig.Spare), so
// that a provision waits for none. It needs root and the ip command
// (iproute2). A restarted plane adopts the namespaces of the live cells it
// finds (their address and policy are recorded in StateDir) and removes
// the others.
type EgressNet struct {
	cfg EgressConfig
	gw  *gateway.Gateway
	log *slog.Logger

	mu     sync.Mutex
	byAddr map[netip.Addr]*egressCell
	byCell map[uuid.UUID]*egressCell
	// used are the addresses given a namespace (a cell's or a spare's) or
	// being given one; spares are the namespaces made ahead, no cell's yet.
	used   map[netip.Addr]bool
	spares []netip.Addr
	refill chan struct{} // wakes the maker of spares
	made   chan struct{} // closed when the maker of spares has stopped
	next   netip.Addr    // the next address to try
	// gone are the cells detached lately, oldest first: the gateway keeps
	// their counts until keptCounts later cells are gone.
	gone []uuid.UUID
}

// keptCounts is how many destroyed cells' connection counts are kept.
const keptCounts = 4096

// egressCell is one cell's place on the net.
type egressCell struct {
	id     uuid.UUID
	addr   netip.Addr
	policy egress.Policy
}

// EgressConfig configures an EgressNet.
type EgressConfig struct {
	// Name tells this plane's namespaces from others' on the host:
	// "sbw-<Name>-gw" is the gateway's, "sbw-<Name>-<cell>" a cell's.
	// 1–16 characters of [a-z0-9]; default "egress".
	Name string
	// Address is the gateway's address in the cells' net; default
	// 100.64.0.1. Subnet holds it and the cells' addresses; default
	// 100.64.0.0/16 (RFC 6598, which the gateway never connects to).
	Address netip.Addr
	Subnet  netip.Prefix
	// Ports are the TCP ports the gateway listens on: every port a policy
	// of the plane's pools allows (default 443 and 80). A cell's
	// connection to another port is refused.
	Ports []uint16
	// StateDir records each cell's address and policy, for a restarted
	// plane; created 0700. Required.
	StateDir string
	// Spare is how many namespaces are kept made ahead of provisions
	// (default 2).
	Spare int
	// Resolve, Dial and Own are the gateway's (gateway.Config).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)
	Dial    func(ctx context.Context, addr netip.AddrPort) (net.Conn, error)
	Own     []netip.Prefix
	Logger  *slog.Logger
}

var egressNameRE = regexp.MustCompile(`^[a-z0-9]{1,16}$`)

// NewEgressNet makes (or adopts) the gateway's namespace, opens the
// gateway's sockets in it and serves them until ctx ends, and adopts the
// namespaces of the cells recorded in StateDir, removing any other of
// its namespaces.
func NewEgressNet(ctx context.Context, cfg EgressConfig) (*EgressNet, error) {
	if cfg.Name == "" {
		cfg.Name = "egress"
	}
	if !cfg.Address.IsValid() {
		cfg.Address = netip.MustParseAddr("100.64.0.1")
	}
	if !cfg.Subnet.IsValid() {
		cfg.Subnet = netip.MustParsePrefix("100.64.0.0/16")
	}
	if len(cfg.Ports) == 0 {
		cfg.Ports = []uint16{443, 80}
	}
	if cfg.Spare <= 0 {
		cfg.Spare = 2
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	switch {
	case !egressNameRE.MatchString(cfg.Name):
		return nil, fmt.Errorf("gvisor: egress name %q: want 1-16 characters of [a-z0-9]", cfg.Name)
	case !cfg.Address.Is4() || !cfg.Subnet.Addr().Is4() || !cfg.Subnet.Contains(cfg.Address) || cfg.Subnet.Bits() > 30:
		return nil, fmt.Errorf("gvisor: egress address %v must be IPv4 inside the subnet %v (at most /30)", cfg.Address, cfg.Subnet)
	case cfg.StateDir == "":
		return nil, errors.New("gvisor: egress state dir is required")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("gvisor: egress needs the ip command (iproute2): %w", err)
	}
	var err error
	if cfg.StateDir, err = privateDir(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("gvisor: egress state dir: %w", err)
	}
	n := &EgressNet{cfg: cfg, log: cfg.Logger.With("egress", cfg.Name), byAddr: map[netip.Addr]*egressCell{},
		byCell: map[uuid.UUID]*egressCell{}, used: map[netip.Addr]bool{}, refill: make(chan struct{}, 1),
		made: make(chan struct{}), next: cfg.Subnet.Masked().Addr().Next()}
	n.gw, err = gateway.New(gateway.Config{Address: cfg.Address, Lookup: n.lookup, Resolve: cfg.Resolve, Dial: cfg.Dial,
		Own: cfg.Own, Logger: n.log})
	if err != nil {
		return nil, err
	}
	gwns := n.gatewayNS()
	if !nsExists(gwns) {
		if err := ipBatch(ctx, "", "netns add "+gwns); err != nil {
			return nil, err
		}
	}
	// The gateway's address on its loopback answers on every veth; the
	// namespace forwards nothing (a new namespace's default).
	if err := ipBatch(ctx, gwns, "link set lo up", "address replace "+cfg.Address.String()+"/32 dev lo"); err != nil {
		return nil, err
	}
	if err := n.adopt(ctx); err != nil {
		return nil, err
	}
	var pc net.PacketConn
	var lns []net.Listener
	err = inNetNS(nsPath(gwns), func() error {
		// Strict reverse-path filtering: a packet whose source is not
		// routed back through the veth it came on (a cell posing as
		// another) is dropped before the gateway sees it.
		for _, conf := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+conf+"/rp_filter", []byte("1"), 0o644); err != nil {
				return err
			}
		}
		var err error
		if pc, err = net.ListenPacket("udp4", netip.AddrPortFrom(cfg.Address, 53).String()); err != nil {
			return err
		}
		for _, port := range cfg.Ports {
			ln, err := net.Listen("tcp4", netip.AddrPortFrom(cfg.Address, port).String())
			if err != nil {
				return err
			}
			lns = append(lns, ln)
		}
		return nil
	})
	if err != nil {
		if pc != nil {
			pc.Close()
		}
		for _, ln := range lns {
			ln.Close()
		}
		return nil, fmt.Errorf("gvisor: egress gateway sockets: %w", err)
	}
	go n.gw.ServeDNS(ctx, pc)
	for _, ln := range lns {
		go n.gw.ServeTCP(ctx, ln)
	}
	go n.makeSpares(ctx)
	return n, nil
}

// makeSpares keeps Spare namespaces made ahead until ctx ends. A failure
// is logged and retried at the next provision's wake-up.
func (n *EgressNet) makeSpares(ctx context.Context) {
	defer close(n.made)
	n.wake()
	for {
		select {
		case <-ctx.Done():
			return
		case <-n.refill:
		}
		for ctx.Err() == nil {
			n.mu.Lock()
			if len(n.spares) >= n.cfg.Spare {
				n.mu.Unlock()
				break
			}
			addr, err := n.allocate()
			n.mu.Unlock()
			if err != nil {
				n.log.Warn("no spare egress namespace", "error", err)
				break
			}
			if err := n.makeNS(ctx, addr); err != nil {
				n.log.Warn("making a spare egress namespace", "error", err)
				n.free(context.WithoutCancel(ctx), addr)
				break
			}
			n.mu.Lock()
			n.spares = append(n.spares, addr)
			n.mu.Unlock()
		}
	}
}

// wake asks for the spares to be made up.
func (n *EgressNet) wake() {
	select {
	case n.refill <- struct{}{}:
	default:
	}
}

// Gateway returns the gateway, whose Counts are the cells' connections by
// host (the key is the cell ID).
func (n *EgressNet) Gateway() *gateway.Gateway { return n.gw }

func (n *EgressNet) gatewayNS() string { return "sbw-" + n.cfg.Name + "-gw" }

// addrNS names the namespace of the cell (or spare) at addr.
func (n *EgressNet) addrNS(addr netip.Addr) string {
	return "sbw-" + n.cfg.Name + "-" + strings.ReplaceAll(addr.String(), ".", "-")
}

func (n *EgressNet) stateFile(id uuid.UUID) string {
	return filepath.Join(n.cfg.StateDir, id.String()+".egress")
}

// lookup is the gateway's Lookup: the cell an address was given to.
func (n *EgressNet) lookup(src netip.Addr) (gateway.Source, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	c, ok := n.byAddr[src.Unmap()]
	if !ok {
		return gateway.Source{}, false
	}
	return gateway.Source{Policy: c.policy, Key: c.id.String()}, true
}

// Attach gives the cell a namespace (one made ahead when there is one)
// with policy p and returns its path, for the cell's OCI spec. Attaching
// a cell attached already gives it a new namespace.
func (n *EgressNet) Attach(ctx context.Context, id uuid.UUID, p egress.Policy) (string, error) {
	if err := n.Detach(ctx, id); err != nil {
		return "", err
	}
	n.mu.Lock()
	var addr netip.Addr
	var err error
	spare := len(n.spares) > 0
	if spare {
		addr, n.spares = n.spares[0], n.spares[1:]
	} else {
		addr, err = n.allocate()
	}
	n.mu.Unlock()
	n.wake()
	if err != nil {
		return "", err
	}
	if !spare {
		if err := n.makeNS(ctx, addr); err != nil {
			n.free(context.WithoutCancel(ctx), addr)
			return "", fmt.Errorf("gvisor: egress namespace of cell %s: %w", id, err)
		}
	}
	// Recorded before runsc may use it: a namespace without a record was
	// never a cell's, and a restarted plane deletes it.
	if err := n.record(id, addr, p); err != nil {
		n.free(context.WithoutCancel(ctx), addr)
		return "", err
	}
	c := &egressCell{id: id, addr: addr, policy: p}
	n.mu.Lock()
	n.byAddr[addr], n.byCell[id] = c, c
	n.mu.Unlock()
	return nsPath(n.addrNS(addr)), nil
}

// makeNS makes the namespace of addr: a veth pair from it to the
// gateway's namespace, addr on its end, a route to the gateway alone, and
// on the gateway's end a route back to addr.
func (n *EgressNet) makeNS(ctx context.Context, addr netip.Addr) error {
	a4 := addr.As4()
	tag := fmt.Sprintf("%02x%02x%02x%02x", a4[0], a4[1], a4[2], a4[3])
	ns, host, cell := n.addrNS(addr), "sbh"+tag, "sbc"+tag
	err := ipBatch(ctx, "", "netns add "+ns, "link add "+host+" type veth peer name "+cell+" netns "+ns,
		"link set "+host+" netns "+n.gatewayNS())
	if err == nil {
		err = ipBatch(ctx, n.gatewayNS(), "link set "+host+" up", "route replace "+addr.String()+"/32 dev "+host)
	}
	if err == nil {
		err = ipBatch(ctx, ns, "link set lo up", "link set "+cell+" name eth0", "address add "+addr.String()+"/32 dev eth0",
			"link set eth0 up", "route add "+n.cfg.Address.String()+"/32 dev eth0")
	}
	return err
}

// free deletes the namespace of addr, if there is one (with it the veth
// pair and the routes), and frees the address.
func (n *EgressNet) free(ctx context.Context, addr netip.Addr) error {
	if ns := n.addrNS(addr); nsExists(ns) {
		if err := ipBatch(ctx, "", "netns delete "+ns); err != nil {
			return err
		}
	}
	n.mu.Lock()
	delete(n.used, addr)
	n.mu.Unlock()
	return nil
}

// Narrow replaces the policy of an attached cell (a claim's narrower one).
func (n *EgressNet) Narrow(id uuid.UUID, p egress.Policy) error {
	n.mu.Lock()
	c, ok := n.byCell[id]
	if ok {
		c.policy = p
	}
	n.mu.Unlock()
	if !ok {
		return fmt.Errorf("gvisor: cell %s has no egress namespace", id)
	}
	return n.record(id, c.addr, p)
}

// Detach removes the cell's namespace (and with it the veth pair and its
// routes), its record and its address. A cell without one is no error.
func (n *EgressNet) Detach(ctx context.Context, id uuid.UUID) error {
	n.mu.Lock()
	c, ok := n.byCell[id]
	n.mu.Unlock()
	if !ok {
		return nil
	}
	if err := n.free(ctx, c.addr); err != nil {
		return err
	}
	if err := os.Remove(n.stateFile(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	n.mu.Lock()
	delete(n.byAddr, c.addr)
	delete(n.byCell, id)
	if n.gone = append(n.gone, id); len(n.gone) > keptCounts {
		n.gw.Forget(n.gone[0].String())
		n.gone = n.gone[1:]
	}
	n.mu.Unlock()
	return nil
}

// Remove deletes the spare namespaces and the gateway's, once no cell is
// attached (a plane whose egress pools are gone for good; tests and
// benchmarks). It waits for the context NewEgressNet got to end, which
// stops the gateway and the making of spares.
func (n *EgressNet) Remove(ctx context.Context) error {
	<-n.made
	n.mu.Lock()
	cells, spares := len(n.byCell), n.spares
	n.spares = nil
	n.mu.Unlock()
	if cells > 0 {
		return fmt.Errorf("gvisor: the egress net still serves %d cells", cells)
	}
	for _, a := range spares {
		if err := n.free(ctx, a); err != nil {
			return err
		}
	}
	if !nsExists(n.gatewayNS()) {
		return nil
	}
	return ipBatch(ctx, "", "netns delete "+n.gatewayNS())
}

// counts are the cell's connections by host, as the gateway counted them.
func (n *EgressNet) counts(id uuid.UUID) map[string]driver.EgressCount {
	var out map[string]driver.EgressCount
	for host, c := range n.gw.Counts(id.String()) {
		if out == nil {
			out = map[string]driver.EgressCount{}
		}
		out[host] = driver.EgressCount{Allowed: c.Allowed, Refused: c.Refused}
	}
	return out
}

// allocate takes a free address of the subnet, neither its first nor its
// last nor the gateway's. The caller holds n.mu.
func (n *EgressNet) allocate() (netip.Addr, error) {
	sub := n.cfg.Subnet.Masked()
	size := 1 << (32 - sub.Bits())
	for range size {
		a := n.next
		if n.next = a.Next(); !sub.Contains(n.next) {
			n.next = sub.Addr().Next()
		}
		last := !sub.Contains(a.Next())
		if !n.used[a] && a != n.cfg.Address && a != sub.Addr() && !last {
			n.used[a] = true
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("gvisor: egress subnet %v has no free address", sub)
}

// record writes the cell's address and policy for a restarted plane.
func (n *EgressNet) record(id uuid.UUID, addr netip.Addr, p egress.Policy) error {
	return os.WriteFile(n.stateFile(id), []byte(addr.String()+"\n"+p.Canonical()+"\n"), 0o600)
}

// adopt registers the cells whose record names a namespace that exists,
// and removes this plane's other namespaces (spares of an earlier run
// among them) and records.
func (n *EgressNet) adopt(ctx context.Context) error {
	recorded := map[netip.Addr]*egressCell{}
	files, err := filepath.Glob(filepath.Join(n.cfg.StateDir, "*.egress"))
	if err != nil {
		return err
	}
	for _, f := range files {
		id, err := uuid.Parse(strings.TrimSuffix(filepath.Base(f), ".egress"))
		c, ok := n.readRecord(id)
		if err != nil || !ok || !nsExists(n.addrNS(c.addr)) {
			if err := os.Remove(f); err != nil {
				return err
			}
			continue
		}
		recorded[c.addr] = c
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "list").Output()
	if err != nil {
		return fmt.Errorf("gvisor: ip netns list: %w", err)
	}
	prefix := "sbw-" + n.cfg.Name + "-"
	for _, line := range strings.Split(string(out), "\n") {
		name, _, _ := strings.Cut(strings.TrimSpace(line), " ")
		if !strings.HasPrefix(name, prefix) || name == n.gatewayNS() {
			continue
		}
		addr, err := netip.ParseAddr(strings.ReplaceAll(strings.TrimPrefix(name, prefix), "-", "."))
		if c, ok := recorded[addr]; err == nil && ok {
			n.byAddr[addr], n.byCell[c.id], n.used[addr] = c, c, true
			continue
		}
		n.log.Info("removing an egress namespace no live cell records", "netns", name)
		if err := ipBatch(ctx, "", "netns delete "+name); err != nil {
			return err
		}
	}
	return nil
}

// readRecord reads a cell's record; false when it is missing or broken.
func (n *EgressNet) readRecord(id uuid.UUID) (*egressCell, bool) {
	b, err := os.ReadFile(n.stateFile(id))
	if err != nil {
		return nil, false
	}
	lines := strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
	addr, err := netip.ParseAddr(lines[0])
	if err != nil || !n.cfg.Subnet.Contains(addr) || len(lines) < 2 {
		return nil, false
	}
	var p egress.Policy
	if lines[1] != "none" {
		if p, err = egress.Parse(lines[1:]); err != nil {
			return nil, false
		}
	}
	return &egressCell{id: id, addr: addr, policy: p}, true
}

// nsPath is where ip keeps a named network namespace.
func nsPath(name string) string { return filepath.Join("/run/netns", name) }

func nsExists(name string) bool {
	_, err := os.Stat(nsPath(name))
	return err == nil
}

// ipBatch runs ip commands, in namespace ns unless it is "", in one ip
// process.
func ipBatch(ctx context.Context, ns string, cmds ...string) error {
	args := []string{"-batch", "-"}
	if ns != "" {
		args = append([]string{"-n", ns}, args...)
	}
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Stdin = strings.NewReader(strings.Join(cmds, "\n") + "\n")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(cmds, "; "), err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// inNetNS runs f on an OS thread that entered the network namespace at
// path: the sockets f opens stay in it. The thread never serves another
// goroutine unless it returned to its namespace.
func inNetNS(path string, f func() error) error {
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		own, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			done <- err
			return
		}
		defer own.Close()
		target, err := os.Open(path)
		if err != nil {
			runtime.UnlockOSThread()
			done <- err
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			done <- fmt.Errorf("entering %s: %w", path, err)
			return
		}
		err = f()
		if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread() // else the thread ends with this goroutine
		}
		done <- err
	}()
	return <-done
}
