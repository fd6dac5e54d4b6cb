package main

// labelsNow is the one way the running agent reads its own labels for
// MaxUnavailableBy= budgets: the reconcile loop asks it at every pass
// (reconcile.Config.Labels: which rack's slot a restart takes) and the
// FleetLock server at every pre-reboot (fleetlock.Config.Labels: which
// rack's slot a reboot takes). They are the labels the agent publishes
// with its membership (Member.Labels), set before the agent runs. Labels
// changed at run time must be made visible here (and safe to read from
// the loop and the FleetLock handlers at once): both take the new bucket
// from their next pass or request.
func (o *runOptions) labelsNow() map[string]string { return o.published }

// bucketSuffix is what `agentd status` adds to a wait-slot action: the
// label bucket of the slot ("wait-slot of rack=r1"; "(no rack)" for a host
// without the label), nothing for a slot of the whole group.
func bucketSuffix(bucket string) string {
	if bucket == "" {
		return ""
	}
	return " of " + bucket
}
