// Package registry is agentd's adapter to etcd v3: the only package that
// imports the etcd client and server.
//
// Key layout under a prefix (default "/agentd"):
//
//	<p>/hosts/<host>/units/<unit>     unit file (raw bytes) for one host
//	<p>/groups/<group>/units/<unit>   unit file for every member of a group
//	<p>/agents/<host>                 JSON reconcile.Member, bound to the agent's lease
//	<p>/status/<host>/<unit>          JSON reconcile.Status, bound to the agent's lease
//	<p>/locks/<scope>/<pool>/<host>   JSON Holder: a MaxUnavailable= slot held or
//	                                  waited for, bound to the agent's lease
//	                                  (<scope> is "groups/<g>" or "hosts/<h>";
//	                                  <pool> the unit, or "<unit>,<key>=<value>"
//	                                  per label value with MaxUnavailableBy=:
//	                                  PoolName);
//	                                  <pool> "reboot" and <host> "fleetlock:<id>" for
//	                                  a reboot's slots (reboot.go), bound to a
//	                                  lease of their own with a TTL
//	<p>/halts/groups/<g>/<unit>       JSON reconcile.Halt: a host failed this
//	                                  version of the group's unit; the others
//	                                  hold off. Not bound to a lease: it stays
//	                                  until new content for the unit is put
//	                                  (Put and Remove delete it) or an
//	                                  operator deletes it
//	<p>/mirror/<name>/state           JSON MirrorState: a git mirror's last
//	                                  commit mirrored and last refused
//	<p>/mirror/<name>/election/       its replicas' leader election, lease-bound
//	<p>/mirror/<name>/sync            JSON SyncRequest, taken by the leader
//	<p>/mirror/owners/<scope>         JSON {name,url,branch}: the mirror that
//	                                  owns a target (<scope> "groups/<g>" or
//	                                  "hosts/<h>"); Put and Remove refuse to
//	                                  write there without Force (mirror.go)
//
// <unit> is a unit name ("hello.service") or a drop-in ("hello.service.d/10-x.conf").
//
// Agent side: [Client.Watch] delivers complete, consistent snapshots of the
// keys meant for a host and the halts of its groups (read at one revision,
// watched from the next one, re-read on compaction, reconnect and
// periodically); [Client.Join] and [Session.Report] publish the agent's
// presence and unit statuses, bound to a lease that is re-created when it
// is lost. [Session.Acquire] and
// [Session.Holding] implement MaxUnavailable= as a lease-bound FIFO
// semaphore per (scope, unit), without a central controller (see
// semaphore.go for the algorithm); [Session.Halt] stops a group's rollout
// of a version this host failed. *Session is a [reconcile.Coordinator].
//
// FleetLock side: [Client.LockReboot] and [Client.UnlockReboot] take and
// give back a reboot's slots in the same queues, all at once and without
// waiting (reboot.go).
//
// CLI side: [Client.Put], [Client.Remove], [Client.List], [Client.Get],
// [Client.Members], [Client.Statuses], [Client.WatchStatuses],
// [Client.Holders], [Client.Slots] and [Client.Halts].
//
// Mirror side (`agentd mirror`, mirror.go): [Client.ApplyCommit] writes a
// git commit as one revision; [Client.MirrorState], [Client.MirrorTree],
// [Client.RefuseCommit], [Client.ResetMirror], [Client.CampaignMirror],
// [Client.RequestMirrorSync], [Client.WatchMirrorSync] and
// [Client.MirrorOwner].
//
// [StartEmbedded] runs a single-node etcd inside the process (for `agentd run`
// without endpoints, and for tests via registrytest.StartEtcd).
//
// A *Client and a *Session are safe for concurrent use. Every method honours
// its ctx; agent-side calls (Watch reads, Join, Report, Acquire, Holding,
// Halt) additionally bound each etcd round trip by a request timeout (5 s)
// so that an unreachable etcd surfaces as an error instead of a hang.
package registry
