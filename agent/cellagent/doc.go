// Package cellagent is the cell agent itself: the in-cell Linux daemon
// that cmd/sandboxwich-agent serves (CONTRACT §13, §14). Its [Agent]
// applies the fence rules of an [agent.Gate] on its monotonic clock and
// implements [agent.Conn]; package agent holds the protocol, the HTTP
// form ([agent.NewHandler]) and the client the control side uses.
//
// # Processes
//
// Every process the agent starts (a command, the launch, a file helper)
// begins its own session, with a base environment (PATH, HOME, TERM=dumb)
// plus the request's and nothing of the agent's own, as uid/gid 1000:1000
// without supplementary groups or capabilities (user cell) or as root. One
// reaper per process collects exit statuses on SIGCHLD: as PID 1 it reaps
// every orphan of the cell (wait4(-1)), so a binary that creates an Agent
// must not use os/exec's Wait beside it; otherwise it waits only for the
// pids the agent started, and a host process keeps its own children. An
// exec answers when its direct child exits (what the pipes hold then is
// still read; processes left in the background keep running, their later
// output dropped); a timeout stops, then kills, the command's session and
// every descendant found through /proc, one that called setsid included.
// At expiry or Release the agent kills every other process of its PID
// namespace when it is PID 1 there (and /proc shows that namespace), else
// only its own sessions and their descendants — never a host process.
//
// File operations and the launch run in a helper: the agent's executable
// re-executed as the requesting user (see [HelperMain]), so the kernel
// checks every path with that user's rights — a cell user cannot make the
// root agent write through a symlink into /etc or read /root, and the
// parents it creates are its own. The content streams through a pipe; a
// write goes to a temporary file in the target directory, renamed into
// place only once all of it arrived.
//
// This package imports only the standard library and package agent.
package cellagent
