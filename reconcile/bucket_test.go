package reconcile

import (
	"strings"
	"testing"
	"time"
)

// [X-Agentd] MaxUnavailableBy=: a label key by selector's rules, and only
// with MaxUnavailable= (the error names both).
func TestParsePolicyMaxUnavailableBy(t *testing.T) {
	by := func(limit int, key string) Policy {
		return Policy{State: StateStarted, OnChange: "auto", Rollback: true, Healthy: 5 * time.Second, SlotLimit: limit, SlotBy: key}
	}
	checkPolicyCases(t, []policyCase{
		{name: "by rack", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=rack\n", want: by(1, "rack")},
		{name: "by before the limit", content: "[X-Agentd]\nMaxUnavailableBy=rack\nMaxUnavailable=2\n", want: by(2, "rack")},
		{name: "a key with a prefix", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=topology.example.com/zone\n",
			want: by(1, "topology.example.com/zone")},
		{name: "a fact's key", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=os.id\n", want: by(1, "os.id")},
		{name: "spaces trimmed", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy = rack \n", want: by(1, "rack")},
		{name: "without MaxUnavailable", content: "[X-Agentd]\nMaxUnavailableBy=rack\n",
			errLike: "MaxUnavailableBy=rack needs MaxUnavailable=: it says how many hosts of each rack may restart the unit at once"},
		{name: "empty", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=\n", errLike: "bad MaxUnavailableBy=: want a host label key"},
		{name: "a selector, not a key", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=rack=r1\n", errLike: `bad MaxUnavailableBy=rack=r1: label key "rack=r1"`},
		{name: "two keys", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=rack zone\n", errLike: "bad MaxUnavailableBy=rack zone"},
		{name: "an empty prefix", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=/rack\n", errLike: "empty prefix"},
		{name: "uppercase prefix", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=Example.com/rack\n", errLike: "bad MaxUnavailableBy=Example.com/rack"},
		{name: "a comma", content: "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=rack,zone\n", errLike: "bad MaxUnavailableBy=rack,zone"},
	})
}

func TestBucketString(t *testing.T) {
	for _, tc := range []struct {
		key    string
		labels map[string]string
		want   string
		budget string
	}{
		{"", map[string]string{"rack": "r1"}, "", "MaxUnavailable=1 in groups/web"},
		{"rack", map[string]string{"rack": "r1"}, "rack=r1", "MaxUnavailable=1 per rack in groups/web, rack=r1"},
		{"rack", map[string]string{"zone": "a"}, "(no rack)",
			"MaxUnavailable=1 per rack in groups/web, (no rack): shared by every host of the group without a rack label"},
		{"rack", map[string]string{"rack": ""}, "(no rack)",
			"MaxUnavailable=1 per rack in groups/web, (no rack): shared by every host of the group without a rack label"},
		{"rack", nil, "(no rack)",
			"MaxUnavailable=1 per rack in groups/web, (no rack): shared by every host of the group without a rack label"},
		{"example.com/zone", map[string]string{"example.com/zone": "a"}, "example.com/zone=a", "MaxUnavailable=1 per example.com/zone in groups/web, example.com/zone=a"},
	} {
		b := BucketOf(tc.key, tc.labels)
		if got := b.String(); got != tc.want {
			t.Errorf("BucketOf(%q, %v) = %q, want %q", tc.key, tc.labels, got, tc.want)
		}
		if got := b.budget(1, "groups/web"); got != tc.budget {
			t.Errorf("BucketOf(%q, %v).budget = %q, want %q", tc.key, tc.labels, got, tc.budget)
		}
	}
}

// A group's restart of a unit with MaxUnavailableBy= waits for the slot
// of this host's rack: the action, the reason, the slot it needs and the
// status all name the bucket.
func TestPlanMaxUnavailableBy(t *testing.T) {
	v1 := svc + "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=rack\n"
	v2 := strings.Replace(v1, "1000", "1001", 1)
	h1 := Hash([]byte(v1))
	base := func(labels map[string]string) Current {
		return Current{
			Host: HostFacts{
				Files: map[string]LocalFile{"hello.service": {Exists: true, Hash: h1, Content: []byte(v1)}},
				Units: map[string]UnitState{"hello.service": running},
			},
			Memory: Memory{
				Managed: map[string]Owned{"hello.service": {Hash: h1}},
				Records: map[string]UnitRecord{"hello.service": {Applied: map[string]string{"hello.service": h1}}},
			},
			Fleet: Fleet{Labels: labels},
		}
	}
	desired := Desire(Snapshot{Entries: []Entry{groupEntry("web", "hello.service", v2)}})
	for _, tc := range []struct {
		name   string
		labels map[string]string
		bucket Bucket
		reason string
	}{
		{"in rack r1", map[string]string{"rack": "r1", "os.id": "debian"}, Bucket{"rack", "r1"},
			"waiting for a rollout slot (MaxUnavailable=1 per rack in groups/web, rack=r1) to "},
		{"without a rack label", map[string]string{"os.id": "debian"}, Bucket{Key: "rack"},
			"waiting for a rollout slot (MaxUnavailable=1 per rack in groups/web, (no rack): shared by every host of the group without a rack label) to "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := base(tc.labels)
			plan := Plan(desired, cur)
			a := plan[0]
			if a.Kind != KindWait || a.Gate.On != WaitSlot || a.Bucket != tc.bucket || !strings.HasPrefix(a.Reason, tc.reason) {
				t.Fatalf("without a slot: %s %s bucket %+v %q\nwant bucket %+v, reason %q…", a.Kind, a.Gate.On, a.Bucket, a.Reason, tc.bucket, tc.reason)
			}
			need := SlotsNeeded(plan, cur)
			if n := need["hello.service"]; n.Scope != "groups/web" || n.Bucket != tc.bucket || n.Limit != 1 {
				t.Errorf("SlotsNeeded: %+v, want groups/web %+v limit 1", need, tc.bucket)
			}
			st := unitStatus(statusInput{Unit: "hello.service", Desired: desired["hello.service"], Action: a, State: &running})
			if st.Action != ActionWaitSlot || st.SlotBucket != tc.bucket.String() {
				t.Errorf("status: action %s, slot bucket %q, want wait-slot %q", st.Action, st.SlotBucket, tc.bucket)
			}
			e, _ := Expect("hello.service", []byte(v2), false, 0)
			if p, detail := e.Assess(HostReport{Statuses: map[string]Status{"hello.service": st}}, func() bool { return true }); p != ProgressSlot ||
				detail != "MaxUnavailable, "+tc.bucket.String() {
				t.Errorf("Assess: %s (%s), want waiting for a slot (MaxUnavailable, %s)", p, detail, tc.bucket)
			}
			// With the slot: restart, and the slot is still needed.
			cur.Fleet.Slots = map[string]string{"hello.service": Hash([]byte(v2))}
			plan = Plan(desired, cur)
			if a := plan[0]; a.Kind != KindRestart || a.Bucket != tc.bucket {
				t.Fatalf("with a slot: %s %+v", a.Kind, a.Bucket)
			}
			if n := SlotsNeeded(plan, cur)["hello.service"]; n.Bucket != tc.bucket {
				t.Errorf("SlotsNeeded with the slot: %+v", n)
			}
		})
	}
	// Without MaxUnavailableBy= the slot is the group's, whatever the labels.
	plain := strings.Replace(v2, "MaxUnavailableBy=rack\n", "", 1)
	a := Plan(Desire(Snapshot{Entries: []Entry{groupEntry("web", "hello.service", plain)}}), base(map[string]string{"rack": "r1"}))[0]
	if a.Gate.On != WaitSlot || a.Bucket != (Bucket{}) || !strings.HasPrefix(a.Reason, "waiting for a rollout slot (MaxUnavailable=1 in groups/web) to ") {
		t.Errorf("without MaxUnavailableBy=: bucket %+v, %q", a.Bucket, a.Reason)
	}
	// A host's own key has no slot, hence no bucket.
	a = Plan(Desire(Snapshot{Entries: []Entry{entry("hello.service", v2)}}), base(map[string]string{"rack": "r1"}))[0]
	if a.Kind != KindRestart || a.Bucket != (Bucket{}) {
		t.Errorf("host key: %s %+v", a.Kind, a.Bucket)
	}
}

// A preview (`unit put --dry-run`) names the bucket of the slot a host's
// restart will take, by the labels the host publishes.
func TestPreviewNamesTheBucket(t *testing.T) {
	v1 := svc + "[X-Agentd]\nMaxUnavailable=1\nMaxUnavailableBy=rack\n"
	v2 := strings.Replace(v1, "1000", "1001", 1)
	st := Status{Unit: "hello.service", Hash: Hash([]byte(v1)), DesiredHash: Hash([]byte(v1)), LoadState: "loaded",
		ActiveState: "active", SubState: "running", Health: HealthHealthy, Source: "group:web"}
	for _, tc := range []struct {
		labels map[string]string
		want   string
	}{
		{map[string]string{"rack": "r2"}, "(after a rollout slot: MaxUnavailable=1 per rack in groups/web, rack=r2)"},
		{nil, "(after a rollout slot: MaxUnavailable=1 per rack in groups/web, (no rack): shared by every host of the group without a rack label)"},
	} {
		v := HostView{Host: "h1", Labels: tc.labels,
			Snapshot: Snapshot{Entries: []Entry{groupEntry("web", "hello.service", v1)}},
			Statuses: map[string]Status{"hello.service": st}}
		ps := Preview(v, Put{Scope: ScopeGroup, Group: "web", Units: map[string][]byte{"hello.service": []byte(v2)}})
		if len(ps) != 1 || ps[0].Do != DoRestart || !strings.HasSuffix(ps[0].Reason, tc.want) {
			t.Errorf("labels %v: %+v, want a restart ending %q", tc.labels, ps, tc.want)
		}
	}
}
