package reliability

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// netSplit runs each replica in a network namespace of its own with two
// links to the host: one to the database (a private PostgreSQL cluster
// listening on the host's end of it) and one the harness's clients use.
// An outage cuts one replica's database link with blackhole routes at
// both ends, so that packets vanish as in a real partition (no error
// reaches either side: TCP retransmits until the link heals) while its
// clients still reach it; the other replica keeps its database.
//
// Addresses: replica i's database link is 10.253.<i+1>.0/30 (host .1,
// namespace .2), its client link 10.254.<i+1>.0/30. Everything is made
// by the run and removed at the end: namespaces, links, routes, the
// cluster; nothing leaves the machine.
type netSplit struct {
	c   *Cluster
	bin string
	tag string // unique per run: names of namespaces and links
	n   int
	cut int // the replica cut off, or -1
}

func newNetSplit(ctx context.Context, bin string, n int) (*netSplit, error) {
	p := &netSplit{bin: bin, tag: fmt.Sprintf("%04x", os.Getpid()&0xffff), n: n, cut: -1}
	var hosts []string
	for i := range n {
		ns := p.ns(i)
		steps := [][]string{
			{"netns", "add", ns},
			{"netns", "exec", ns, "ip", "link", "set", "lo", "up"},
		}
		for _, l := range []struct{ name, net string }{{"d", p.dbNet(i)}, {"c", p.clientNet(i)}} {
			host, inside := p.link(l.name, i, "h"), p.link(l.name, i, "n")
			steps = append(steps,
				[]string{"link", "add", host, "type", "veth", "peer", "name", inside},
				[]string{"link", "set", inside, "netns", ns},
				[]string{"addr", "add", l.net + ".1/30", "dev", host},
				[]string{"link", "set", host, "up"},
				[]string{"netns", "exec", ns, "ip", "addr", "add", l.net + ".2/30", "dev", inside},
				[]string{"netns", "exec", ns, "ip", "link", "set", inside, "up"})
		}
		for _, s := range steps {
			if err := ip(ctx, s...); err != nil {
				p.remove()
				return nil, fmt.Errorf("network for replica %d: %w", i, err)
			}
		}
		hosts = append(hosts, p.dbNet(i)+".1")
	}
	c, err := StartCluster(ctx, hosts, []string{"10.253.0.0/16"})
	if err != nil {
		p.remove()
		return nil, err
	}
	p.c = c
	return p, nil
}

func (p *netSplit) ns(i int) string { return fmt.Sprintf("sbw-rel-%s-%d", p.tag, i) }
func (p *netSplit) link(kind string, i int, end string) string {
	return fmt.Sprintf("sbw%s%d%s%s", kind, i, end, p.tag) // at most 15 characters
}
func (p *netSplit) dbNet(i int) string     { return fmt.Sprintf("10.253.%d", i+1) }
func (p *netSplit) clientNet(i int) string { return fmt.Sprintf("10.254.%d", i+1) }

// ip runs the ip command.
func ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// place runs replica i inside its namespace, connected to the database
// through its own link, listening on its client link.
func (p *netSplit) place(i int, spec ServerSpec) (ServerSpec, string) {
	spec.Args = append([]string{"netns", "exec", p.ns(i), spec.Bin}, spec.Args...)
	spec.Bin = "ip"
	spec.DatabaseURL = p.c.URLAt(p.dbNet(i) + ".1")
	return spec, p.clientNet(i) + ".2:18080"
}

// route adds or deletes (verb) the blackhole routes that cut replica i's
// database link: one in its namespace towards the database, one on the
// host back.
func (p *netSplit) route(ctx context.Context, i int, verb string) error {
	if err := ip(ctx, "netns", "exec", p.ns(i), "ip", "route", verb, "blackhole", p.dbNet(i)+".1/32"); err != nil {
		return err
	}
	return ip(ctx, "route", verb, "blackhole", p.dbNet(i)+".2/32")
}

// away cuts the database link of replica k mod n.
func (p *netSplit) away(ctx context.Context, k int) (string, error) {
	i := k % p.n
	if err := p.route(ctx, i, "add"); err != nil {
		return "", err
	}
	p.cut = i
	return fmt.Sprintf("cut-%d", i), nil
}

func (p *netSplit) back(ctx context.Context) error {
	if p.cut < 0 {
		return nil
	}
	i := p.cut
	p.cut = -1
	return p.route(ctx, i, "del")
}

func (p *netSplit) gone() []int {
	if p.cut < 0 {
		return nil
	}
	return []int{p.cut}
}

func (p *netSplit) check(context.Context, *DB) string { return "" }

// leftovers reports what remove left of the run: namespaces, links or
// routes named or addressed by it.
func (p *netSplit) leftovers(ctx context.Context) error {
	var left []string
	for _, args := range [][]string{{"netns", "list"}, {"link", "show"}, {"route", "show"}} {
		out, err := exec.CommandContext(ctx, "ip", args...).Output()
		if err != nil {
			return fmt.Errorf("ip %s: %w", strings.Join(args, " "), err)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, p.tag) || strings.Contains(l, "10.253.") || strings.Contains(l, "10.254.") {
				left = append(left, strings.TrimSpace(l))
			}
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("teardown left: %s", strings.Join(left, "; "))
	}
	return nil
}

// remove deletes what newNetSplit made: the cluster, the host's routes,
// the namespaces (and with them both ends of their links).
func (p *netSplit) remove() {
	ctx := context.Background()
	if p.c != nil {
		p.c.Remove()
	}
	for i := range p.n {
		_ = ip(ctx, "route", "del", "blackhole", p.dbNet(i)+".2/32")
		_ = ip(ctx, "netns", "del", p.ns(i))
		for _, kind := range []string{"d", "c"} {
			_ = ip(ctx, "link", "del", p.link(kind, i, "h")) // when the namespace was not made
		}
	}
}

// RunLinPartition records a linearizability run (RunLinearizability with
// cfg) against two replicas of spec in network namespaces sharing a
// private PostgreSQL cluster, while their database links are cut (one
// replica at a time, 0.5–3 s) and healed (1–3 s) at random moments. It
// returns the report and the number of cuts.
func RunLinPartition(ctx context.Context, env *Env, cfg LinConfig, spec ServerSpec) (rep LinReport, cuts int, err error) {
	p, err := newNetSplit(ctx, spec.Bin, 2)
	if err != nil {
		return rep, 0, err
	}
	defer func() {
		p.remove()
		if lerr := p.leftovers(context.Background()); lerr != nil && err == nil {
			err = lerr
		}
	}()
	for i := range p.n {
		s, addr := p.place(i, spec)
		s.LogFile = filepath.Join(env.Dir, fmt.Sprintf("server-%d.log", i))
		srv, serr := env.Start(ctx, s, addr)
		if serr != nil {
			return rep, 0, serr
		}
		defer srv.Stop(5 * time.Second)
		cfg.Backends = append(cfg.Backends, srv.URL)
	}
	cutCtx, stopCuts := context.WithCancel(ctx)
	cutCount := make(chan int, 1)
	go func() {
		rng := rand.New(rand.NewPCG(cfg.Seed, 13))
		n := 0
		defer func() { cutCount <- n }()
		pause := func(lo, hi time.Duration) bool {
			select {
			case <-cutCtx.Done():
				return false
			case <-time.After(lo + time.Duration(rng.Int64N(int64(hi-lo)))):
				return true
			}
		}
		for pause(time.Second, 3*time.Second) {
			if _, err := p.away(context.Background(), rng.IntN(p.n)); err != nil {
				env.Log.Error("partition: cut", "error", err)
				return
			}
			n++
			pause(500*time.Millisecond, 3*time.Second)
			if err := p.back(context.Background()); err != nil {
				env.Log.Error("partition: heal", "error", err)
				return
			}
		}
	}()
	rep, err = RunLinearizability(ctx, env, cfg)
	stopCuts()
	return rep, <-cutCount, err
}
