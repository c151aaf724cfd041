package cellagent

import (
	"bytes"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
)

// kernelRelease returns the release of the kernel the agent runs on, as
// uname(2) reports it: inside gVisor, gVisor's own.
func kernelRelease() string {
	var u syscall.Utsname
	if err := syscall.Uname(&u); err != nil {
		return ""
	}
	b := make([]byte, 0, len(u.Release))
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b)
}

// The process layer. Every child the agent starts goes through
// procTable.spawn: it starts in its own session (so its process group and
// session are numbered by its pid), and its exit status comes from the one
// reaper of the process. Killing walks /proc, so that a descendant which
// left the session is still found through its parent.

// reaper collects the exit statuses of this process's children on
// SIGCHLD and delivers each to whoever started that pid. It is the only
// caller of wait4 in the agent; os/exec's Wait must not be used alongside
// (it would race for the same statuses). As PID 1 it reaps every child,
// orphans adopted from the cell included (wait4(-1)); otherwise it waits
// only for the pids it started, so a host process (a test binary) keeps
// its own children to itself.
type reaper struct {
	once    sync.Once
	mu      sync.Mutex
	all     bool
	waiting map[int]chan exitStatus
}

// reap is the process's reaper: a process has one set of children, so
// there is one reaper per process, not per Agent.
var reap reaper

func (r *reaper) init() {
	r.once.Do(func() {
		r.all = os.Getpid() == 1
		r.waiting = make(map[int]chan exitStatus)
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGCHLD)
		go func() {
			// The tick is a safety net only: spawn registers a pid under
			// r.mu before collect can look for it, and a SIGCHLD that
			// arrives during a collect leaves the channel full, so the
			// next collect runs.
			tick := time.NewTicker(time.Second)
			for {
				select {
				case <-sig:
				case <-tick.C:
				}
				r.collect()
			}
		}()
	})
}

// start runs fork (which starts one child) with the reaper locked and
// registers the child's pid before any status can be collected.
func (r *reaper) start(fork func() (int, error)) (int, <-chan exitStatus, error) {
	r.init()
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	c := make(chan exitStatus, 1)
	r.waiting[pid] = c
	return pid, c, nil
}

// collect reaps every child that has exited.
func (r *reaper) collect() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.all {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				return
			}
			r.deliver(pid, statusOf(ws)) // an orphan's status has no one to go to
		}
	}
	for pid := range r.waiting {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		for err == syscall.EINTR {
			got, err = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
		}
		switch {
		case err == syscall.ECHILD: // reaped by someone else: the status is lost
			r.deliver(pid, exitStatus{code: -1, lost: true})
		case err == nil && got == pid:
			r.deliver(pid, statusOf(ws))
		}
	}
}

func (r *reaper) deliver(pid int, es exitStatus) {
	if c, ok := r.waiting[pid]; ok {
		delete(r.waiting, pid)
		c <- es
	}
}

// statusOf maps a wait status: the exit code, or 128 + the signal number.
func statusOf(ws syscall.WaitStatus) exitStatus {
	if ws.Signaled() {
		sig := ws.Signal()
		return exitStatus{code: 128 + int(sig), signal: signalName(sig)}
	}
	return exitStatus{code: ws.ExitStatus()}
}

// signalNames are the Linux signals by number, without "SIG".
var signalNames = [...]string{
	1: "HUP", 2: "INT", 3: "QUIT", 4: "ILL", 5: "TRAP", 6: "ABRT", 7: "BUS", 8: "FPE",
	9: "KILL", 10: "USR1", 11: "SEGV", 12: "USR2", 13: "PIPE", 14: "ALRM", 15: "TERM",
	16: "STKFLT", 17: "CHLD", 18: "CONT", 19: "STOP", 20: "TSTP", 21: "TTIN", 22: "TTOU",
	23: "URG", 24: "XCPU", 25: "XFSZ", 26: "VTALRM", 27: "PROF", 28: "WINCH", 29: "IO",
	30: "PWR", 31: "SYS",
}

func signalName(s syscall.Signal) string {
	if int(s) > 0 && int(s) < len(signalNames) {
		return signalNames[s]
	}
	return "SIG" + strconv.Itoa(int(s))
}

// procTable is what one Agent started: one session per child.
type procTable struct {
	mu       sync.Mutex
	sessions map[int]*session // by session id, the leader's pid
	ending   bool
	endDone  chan struct{}
}

// session is a child the agent started and the session it leads.
type session struct {
	leader int
	alive  bool // the leader is not reaped yet, so its pid is not reused
}

func newProcTable() *procTable {
	return &procTable{sessions: make(map[int]*session), endDone: make(chan struct{})}
}

// spawn starts path in a new session with the reaper's bookkeeping. Once
// the agent is ending nothing starts any more (ErrExpired).
func (t *procTable) spawn(path string, argv []string, attr *syscall.ProcAttr) (int, <-chan exitStatus, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ending {
		return 0, nil, agent.Errorf(agent.CodeExpired, "the lease ended")
	}
	if attr.Sys == nil {
		attr.Sys = &syscall.SysProcAttr{}
	}
	attr.Sys.Setsid = true
	pid, raw, err := reap.start(func() (int, error) { return syscall.ForkExec(path, argv, attr) })
	if err != nil {
		return 0, nil, err
	}
	s := &session{leader: pid, alive: true}
	t.sessions[pid] = s
	exited := make(chan exitStatus, 1)
	go func() {
		es := <-raw
		t.mu.Lock()
		s.alive = false
		t.mu.Unlock()
		exited <- es
		t.forgetIfEmpty(pid)
	}()
	return pid, exited, nil
}

// forgetIfEmpty forgets the session of a reaped leader when no process
// is left in it (none can join it later), before its number can be
// reused; a session that outlives its leader is forgotten by the first
// kill that finds it empty (tree).
func (t *procTable) forgetIfEmpty(id int) {
	for _, p := range scanProcs() {
		if !p.zombie && (p.sid == id || p.pgid == id) {
			return
		}
	}
	t.mu.Lock()
	delete(t.sessions, id)
	t.mu.Unlock()
}

// beginEnd refuses every later spawn.
func (t *procTable) beginEnd() {
	t.mu.Lock()
	t.ending = true
	t.mu.Unlock()
}

// wait returns once killAll has finished.
func (t *procTable) wait() { <-t.endDone }

// killAll kills every process of the cell: as PID 1 every other process
// of the PID namespace; otherwise every process of the sessions the agent
// started and every descendant of those.
func (t *procTable) killAll() {
	defer close(t.endDone)
	if !nsInit() {
		t.kill(0)
		return
	}
	killUntilGone(func(ps []procInfo) []int {
		var v []int
		for _, p := range ps {
			if p.pid != 1 && !p.zombie {
				v = append(v, p.pid)
			}
		}
		return v
	})
}

// nsInit reports whether the agent is PID 1 of its PID namespace and
// /proc shows that namespace (so that every pid /proc lists is the
// cell's, never the host's).
func nsInit() bool {
	self, err := os.Readlink("/proc/self")
	return os.Getpid() == 1 && err == nil && self == "1"
}

// killTree kills the session led by leader (a command that timed out),
// and every descendant of it that left the session.
func (t *procTable) killTree(leader int) { t.kill(leader) }

// kill stops, then kills, the tree of the session led by only (0: of
// every session). Stopping first keeps the tree from growing while it is
// walked: a stopped process cannot fork, and its children stay its
// children, so none is orphaned out of sight.
func (t *procTable) kill(only int) {
	sel := func(ps []procInfo) []int { return t.tree(ps, only) }
	seen := make(map[int]bool)
	for range 50 {
		fresh := false
		for _, pid := range sel(scanProcs()) {
			if !seen[pid] {
				seen[pid], fresh = true, true
				_ = syscall.Kill(pid, syscall.SIGSTOP)
			}
		}
		if !fresh {
			break
		}
	}
	for pid := range seen {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	killUntilGone(sel)
}

// killUntilGone sends SIGKILL to what sel selects until it selects
// nothing (a bounded number of rounds).
func killUntilGone(sel func([]procInfo) []int) {
	for round := range 200 {
		v := sel(scanProcs())
		if len(v) == 0 {
			return
		}
		for _, pid := range v {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(time.Duration(min(round+1, 20)) * time.Millisecond)
	}
}

// tree selects the live processes of the agent's sessions (only one when
// only is not 0): the session's or group's members, the leader while it
// is not reaped, and every descendant of those. A session whose leader was
// reaped and which has no member left is forgotten, so that a later
// process reusing its number is never taken for it.
func (t *procTable) tree(ps []procInfo, only int) []int {
	t.mu.Lock()
	defer t.mu.Unlock()
	self := os.Getpid()
	byPID := make(map[int]procInfo, len(ps))
	children := make(map[int][]int)
	members := make(map[int]int) // session id → live members
	for _, p := range ps {
		byPID[p.pid] = p
		children[p.ppid] = append(children[p.ppid], p.pid)
		if p.zombie {
			continue
		}
		if t.sessions[p.sid] != nil {
			members[p.sid]++
		}
		if p.pgid != p.sid && t.sessions[p.pgid] != nil {
			members[p.pgid]++
		}
	}
	var queue []int
	seen := map[int]bool{self: true, 1: true}
	for id, s := range t.sessions {
		if !s.alive {
			if _, reused := byPID[id]; reused || members[id] == 0 {
				delete(t.sessions, id)
				continue
			}
		}
		if only != 0 && id != only {
			continue
		}
		if s.alive && !seen[id] {
			seen[id] = true
			queue = append(queue, id)
		}
	}
	for _, p := range ps {
		in := func(id int) bool { return t.sessions[id] != nil && (only == 0 || id == only) }
		if !p.zombie && !seen[p.pid] && (in(p.sid) || in(p.pgid)) {
			seen[p.pid] = true
			queue = append(queue, p.pid)
		}
	}
	var victims []int
	for i := 0; i < len(queue); i++ {
		pid := queue[i]
		if p, ok := byPID[pid]; ok && !p.zombie {
			victims = append(victims, pid)
		}
		for _, c := range children[pid] {
			if !seen[c] {
				seen[c] = true
				queue = append(queue, c)
			}
		}
	}
	return victims
}

// procInfo is one process as /proc/<pid>/stat shows it.
type procInfo struct {
	pid, ppid, pgid, sid int
	zombie               bool
}

// scanProcs lists the processes /proc shows.
func scanProcs() []procInfo {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	ps := make([]procInfo, 0, len(names))
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + n + "/stat")
		if err != nil {
			continue // gone
		}
		if p, ok := parseStat(pid, b); ok {
			ps = append(ps, p)
		}
	}
	return ps
}

// parseStat reads state, ppid, pgrp and session from a stat line; the
// command name before them may hold any byte, so parsing starts after the
// last ')'.
func parseStat(pid int, b []byte) (procInfo, bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return procInfo{}, false
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 4 {
		return procInfo{}, false
	}
	ppid, err1 := strconv.Atoi(string(f[1]))
	pgid, err2 := strconv.Atoi(string(f[2]))
	sid, err3 := strconv.Atoi(string(f[3]))
	if err1 != nil || err2 != nil || err3 != nil {
		return procInfo{}, false
	}
	state := f[0]
	return procInfo{pid: pid, ppid: ppid, pgid: pgid, sid: sid, zombie: len(state) == 1 && (state[0] == 'Z' || state[0] == 'X')}, true
}

// canBecome reports whether this process can start children as c: root
// can become anyone; another user only itself.
func canBecome(c cred) error {
	if os.Geteuid() == 0 || (uint32(os.Geteuid()) == c.uid && uint32(os.Getegid()) == c.gid) {
		return nil
	}
	return agent.Errorf(agent.CodeUserUnsupported, "the agent does not run as root, so it cannot switch to uid "+strconv.Itoa(int(c.uid)))
}

// sys is the credential a child starts with: the uid and gid, no
// supplementary groups. A non-root agent starts children as itself.
func (c cred) sys() *syscall.Credential {
	if os.Geteuid() != 0 {
		return nil
	}
	return &syscall.Credential{Uid: c.uid, Gid: c.gid, Groups: []uint32{}}
}
