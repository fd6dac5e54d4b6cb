package reconcile

import "strconv"

// Bucket is the label part of a MaxUnavailable= semaphore: with
// [X-Agentd] MaxUnavailableBy=KEY the unit's semaphore in its scope is one
// per value of the host label KEY, and a host queues in the one of its own
// value — at most MaxUnavailable= hosts per rack restart the unit at once,
// racks in parallel. The zero Bucket is the semaphore of the whole scope
// (no MaxUnavailableBy=).
//
// A host without the label, or with an empty value, is in the bucket of
// Value "": one shared by every such host of the scope, shown as
// "(no rack)" (the wording of a rollout's --waves-by). It is never
// unbounded: those hosts take turns as one more rack does.
//
// How a Bucket is spelled in an etcd key is the registry's (registry's
// semaphore.go); here it is only the key and the value.
type Bucket struct {
	Key   string // the label key (MaxUnavailableBy=); "" for no bucket
	Value string // this host's value of it; "" when it has none
}

// BucketOf is the bucket of a host with labels for a unit whose
// MaxUnavailableBy= is key ("" gives the zero Bucket).
func BucketOf(key string, labels map[string]string) Bucket {
	if key == "" {
		return Bucket{}
	}
	return Bucket{Key: key, Value: labels[key]}
}

// Labelled says the host has a (non-empty) value of the bucket's key.
func (b Bucket) Labelled() bool { return b.Value != "" }

// String is the bucket as statuses, logs and `agentd locks` name it:
// "rack=r1", "(no rack)" for the hosts without the label, "" for no bucket.
func (b Bucket) String() string {
	switch {
	case b.Key == "":
		return ""
	case b.Value == "":
		return "(no " + b.Key + ")"
	}
	return b.Key + "=" + b.Value
}

// budget says, for a wait reason, which budget of scope a slot is drawn
// from: "MaxUnavailable=1 in groups/web", "MaxUnavailable=1 per rack in
// groups/web, rack=r1", or for a host without the label "… (no rack):
// shared by every host of the group without a rack label".
func (b Bucket) budget(limit int, scope string) string {
	s := "MaxUnavailable=" + strconv.Itoa(limit)
	if b.Key == "" {
		return s + " in " + scope
	}
	s += " per " + b.Key + " in " + scope + ", " + b.String()
	if !b.Labelled() {
		s += ": shared by every host of the group without a " + b.Key + " label"
	}
	return s
}
