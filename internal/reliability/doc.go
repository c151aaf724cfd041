// Package reliability is the harness of the reliability proof
// (scripts/reliability.sh, docs/reliability.md): it drives real server
// processes over loopback, injects faults, records what happened and
// checks it mechanically.
//
//   - [RunLinearizability] records a history of 64 concurrent clients
//     through a [DropProxy] that discards answers after the server
//     answered, and checks it with porcupine against [Model], the
//     sequential specification of claim fences, leases and cells. The
//     model accepts exactly the answers the contract allows, treats
//     operations without a definite answer as pending, and is partitioned
//     by the claim IDs, leases and cells operations connect.
//   - [RunCrash] SIGKILLs a server at random moments while its pool
//     provisions, claims run and cells stop, and checks the database and
//     the provider's objects after every kill ([History], [CheckObjects]).
//     Its server is the real `sandboxwich serve`, with a pool provider
//     whose objects outlive the process (the binary's `dir` provider,
//     internal/dirprovider, or the gVisor driver).
//   - [RunSoak] puts mixed load on a server and reports 5xx, throughput,
//     latency, and whether memory, threads and goroutines stay stable.
//
// The command internal/reliability/cmd/reliability runs one check and prints its
// verdict line.
package reliability
