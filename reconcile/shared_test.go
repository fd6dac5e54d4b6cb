package reconcile

import (
	"strings"
	"testing"
)

const (
	sharedKey  = "a7.service.files/etc/shared/tls.pem"
	sharedUnit = svc + "[X-Agentd]\nRestartTriggers=/etc/shared/tls.pem\n"
)

func revEntry(unit, value string, rev int64) Entry {
	e := entry(unit, value)
	e.ModRevision = rev
	return e
}

// A trigger may name a config file of another unit's set: the reader's
// version includes it, a change of the file is a change of the reader
// (without a key of its own changing), and a second key writing the same
// path is blocked, naming the first.
func TestDesireSharedConfigFile(t *testing.T) {
	base := []Entry{revEntry("a7.service", sharedUnit, 3), revEntry(sharedKey, conf("cert 1\n"), 4), revEntry("b7.service", sharedUnit, 5)}
	var d desiredState
	d.update(Snapshot{Entries: base})
	a, b := d.units["a7.service"], d.units["b7.service"]
	if a.Err != nil || b.Err != nil {
		t.Fatalf("errors: a7 %v, b7 %v", a.Err, b.Err)
	}
	if len(b.Reads) != 1 || b.Reads[sharedKey].Hash != Hash([]byte(conf("cert 1\n"))) || len(b.Files()) != 1 {
		t.Fatalf("b7 reads %v, writes %d files; want a7's file read, its own unit file written", b.Reads, len(b.Files()))
	}
	if !strings.Contains(ContentKey(b), sharedKey+"=") {
		t.Errorf("b7's version %q leaves out the file it reads", ContentKey(b))
	}

	// The file changes: a7 (its key) and b7 (what it reads) both change.
	changes := d.update(Snapshot{Entries: []Entry{base[0], revEntry(sharedKey, conf("cert 2\n"), 6), base[2]}})
	var names []string
	for _, c := range changes {
		names = append(names, c.name)
	}
	if strings.Join(names, " ") != "a7.service b7.service" {
		t.Fatalf("changes %v, want a7.service and b7.service", names)
	}
	if got := d.units["b7.service"].Reads[sharedKey].Hash; got != Hash([]byte(conf("cert 2\n"))) {
		t.Errorf("b7 reads %s, want the new file", short(got))
	}

	// A second key for the same path: the later one is blocked.
	both := append([]Entry{}, base...)
	both = append(both, revEntry("b7.service.files/etc/shared/tls.pem", conf("cert 3\n"), 9))
	ds := Desire(Snapshot{Entries: both})
	if ds["a7.service"].Err != nil {
		t.Errorf("a7 (the first writer) blocked: %v", ds["a7.service"].Err)
	}
	if err := ds["b7.service"].Err; err == nil || !strings.Contains(err.Error(), "is written by "+sharedKey+" already (revision 4)") {
		t.Errorf("b7 (the second writer): %v, want blocked naming %s", err, sharedKey)
	}

	// A trigger that names a file no unit has.
	ds = Desire(Snapshot{Entries: []Entry{entry("c7.service", svc+"[X-Agentd]\nReloadTriggers=/etc/none\n")}})
	if err := ds["c7.service"].Err; err == nil || !strings.Contains(err.Error(), "ReloadTriggers= names /etc/none, which is not a file of c7.service's set nor of another unit's") {
		t.Errorf("a trigger naming nothing: %v", err)
	}
}

// One change of a shared file: its unit writes it and restarts, the reader
// restarts and writes nothing. A reader whose writer is held waits for it.
func TestPlanSharedConfigFile(t *testing.T) {
	oldConf, newConf := conf("cert 1\n"), conf("cert 2\n")
	uh, oh := Hash([]byte(sharedUnit)), Hash([]byte(oldConf))
	cur := func() Current {
		return Current{
			Host: HostFacts{
				Files: map[string]LocalFile{
					"a7.service": {Exists: true, Hash: uh, Content: []byte(sharedUnit)},
					"b7.service": {Exists: true, Hash: uh, Content: []byte(sharedUnit)},
					sharedKey:    {Exists: true, Hash: oh, Content: []byte(oldConf)},
				},
				Units: map[string]UnitState{"a7.service": running, "b7.service": running},
			},
			Memory: Memory{
				Managed: map[string]Owned{"a7.service": {Hash: uh}, "b7.service": {Hash: uh}, sharedKey: {Hash: oh}},
				Records: map[string]UnitRecord{
					"a7.service": {Applied: map[string]string{"a7.service": uh, sharedKey: oh}},
					"b7.service": {Applied: map[string]string{"b7.service": uh, sharedKey: oh}},
				},
			},
		}
	}
	plan := Plan(Desire(Snapshot{Entries: []Entry{entry("a7.service", sharedUnit), entry(sharedKey, newConf), entry("b7.service", sharedUnit)}}), cur())
	if len(plan) != 2 {
		t.Fatalf("plan %v", plan)
	}
	a, b := plan[0], plan[1]
	if a.Kind != KindRestart || len(a.Steps.Writes) != 1 || a.Steps.Writes[0].Path != sharedKey {
		t.Errorf("a7: %s (%s), writes %v; want a restart writing the file", a.Kind, a.Reason, a.Steps.Writes)
	}
	if b.Kind != KindRestart || len(b.Steps.Writes) != 0 || !strings.Contains(b.Reason, "file /etc/shared/tls.pem (RestartTriggers=)") {
		t.Errorf("b7: %s (%s), writes %v; want a restart for the file, writing nothing", b.Kind, b.Reason, b.Steps.Writes)
	}
	if reload, _ := ReloadNeeded(plan, cur()); reload {
		t.Error("a shared config file's change asks for a daemon-reload")
	}

	// A pass that looks at b7 alone (a signal of its own, a focused
	// plan without a7): the file it reads is on disk at its version, and
	// b7's change goes ahead.
	all := Desire(Snapshot{Entries: []Entry{entry("a7.service", sharedUnit), entry(sharedKey, oldConf), entry("b7.service", sharedUnit+"# v2\n")}})
	delete(all, "a7.service")
	c0 := cur()
	delete(c0.Memory.Records, "a7.service")
	plan = Plan(all, c0)
	for _, a := range plan {
		if a.Unit == "b7.service" && a.Kind == KindWait {
			t.Errorf("b7 alone in a plan waits although the file it reads is in place: %s", a.Reason)
		}
	}

	// a7 waits for a rollout slot: b7 must not restart onto a file not
	// yet written.
	held := svc + "[X-Agentd]\nRestartTriggers=/etc/shared/tls.pem\nMaxUnavailable=1\n"
	c := cur()
	c.Host.Files["a7.service"] = LocalFile{Exists: true, Hash: Hash([]byte(held)), Content: []byte(held)}
	c.Memory.Managed["a7.service"] = Owned{Hash: Hash([]byte(held))}
	c.Memory.Records["a7.service"] = UnitRecord{Applied: map[string]string{"a7.service": Hash([]byte(held)), sharedKey: oh}}
	plan = Plan(Desire(Snapshot{Entries: []Entry{groupEntry("web", "a7.service", held), groupEntry("web", sharedKey, newConf), groupEntry("web", "b7.service", sharedUnit)}}), c)
	a, b = plan[0], plan[1]
	if a.Kind != KindWait || a.Gate.On != WaitSlot {
		t.Fatalf("a7: %s (%s), want a wait for its slot", a.Kind, a.Reason)
	}
	if b.Kind != KindWait || b.Gate.On != WaitWriter || !strings.Contains(b.Reason, "waiting for a7.service to write /etc/shared/tls.pem") {
		t.Errorf("b7: %s (%s), want a wait for a7.service to write the file", b.Kind, b.Reason)
	}
}
