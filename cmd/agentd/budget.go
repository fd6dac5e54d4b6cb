package main

// bucketSuffix is what `agentd status` adds to a wait-slot action: the
// label bucket of the slot ("wait-slot of rack=r1"; "(no rack)" for a host
// without the label), nothing for a slot of the whole group.
func bucketSuffix(bucket string) string {
	if bucket == "" {
		return ""
	}
	return " of " + bucket
}
