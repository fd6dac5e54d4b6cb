// Package mirror is the core of `agentd mirror`: git as the source of truth
// for the registry. It reads a branch of a git repository (a bare clone it
// keeps on disk), lists the commits a fetch brought, checks that each one is
// SSH-signed by an allowed signer and that the branch only moved forward,
// renders a commit's tree into the unit keys `agentd unit put` would store,
// and diffs two such trees with a guard against deleting most of the
// registry by accident.
//
// It does no etcd and no CLI: the command wires these steps to the
// registry. Everything but Repo is pure (no I/O beyond reading git objects
// already fetched); Repo is not safe for concurrent use: one mirror loop
// owns it.
//
// Why every commit and not only the tip: the registry keeps each mirrored
// commit as its own revision, so a commit in the middle of a push would
// otherwise reach hosts (or their history, for a revert) without anybody
// having signed it. VerifyRange stops at the first commit it refuses; the
// caller may apply the good ones before it, and nothing of it or after.
//
// Transports: https and ssh are go-git's own (no git binary). file://
// URLs, meant for tests and a repository on the same machine, run
// git-upload-pack, so they need git installed.
package mirror
