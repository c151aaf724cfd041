package sandboxwich

import (
	"time"

	"github.com/sandboxwich/sandboxwich/agent"
	"github.com/sandboxwich/sandboxwich/driver"
)

// Conversions between the Plane's words (words.go) and those of the cell
// agent's protocol and the drivers: the only place they meet.

func (u User) agent() agent.User { return agent.User(u) }

func outputOf(o agent.Output) Output { return Output{Stream: Stream(o.Stream), Data: o.Data} }

func execResultOfDriver(r driver.ExecResult) ExecResult {
	return ExecResult{ExitCode: r.ExitCode, Stdout: r.Stdout, Stderr: r.Stderr, Truncated: r.Truncated,
		TimedOut: r.TimedOut, Signal: r.Signal, Reason: Reason(r.Reason), Duration: r.Duration}
}

func execResultOfAgent(r agent.ExecResult) ExecResult {
	return ExecResult{ExitCode: r.ExitCode, Signal: r.Signal, Reason: Reason(r.Reason), TimedOut: r.Reason == agent.TimedOut,
		Truncated: r.Truncated, Stdout: r.Stdout, Stderr: r.Stderr, Duration: time.Duration(r.DurationMillis) * time.Millisecond}
}

func launchStatusOf(st agent.LaunchStatus) LaunchStatus {
	out := LaunchStatus{Phase: LaunchPhase(st.Phase), PID: st.PID, ExitCode: st.ExitCode, Signal: st.Signal, Replay: st.Replay}
	if st.Reason != nil {
		r := Reason(*st.Reason)
		out.Reason = &r
	}
	return out
}

func fileInfoOf(fi agent.FileInfo) FileInfo {
	return FileInfo{Path: fi.Path, Size: fi.Size, SHA256: fi.SHA256}
}
