package reconcile_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

// One refused file of a unit's set — here the second config file, whose
// owner this host does not have — leaves the whole set unwritten: not the
// unit file, not the first config file. Other units go on. Once the set is
// right, all of it lands in one pass.
func TestConfigFileSetCheckedBeforeWrite(t *testing.T) {
	units, m, _ := testDirs(t)
	root := filepath.Join(t.TempDir(), "myapp")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	files, err := unitdir.OpenRoots(units, []string{root})
	if err != nil {
		t.Fatal(err)
	}
	defer files.Close()
	sd := &fakeSystemd{active: map[string]bool{}}
	a := reconcile.New(reconcile.Config{Systemd: reconcile.PlainSystemd(sd), Files: files, Manifest: m, CheckFocus: true})
	stop := runAgent(t, a)
	defer stop()

	conf := func(name, owner string) reconcile.Entry {
		v := reconcile.ConfigFile{Mode: 0o640, Owner: owner, Content: []byte(name + "=1\n")}.Encode()
		return reconcile.Entry{Scope: reconcile.ScopeHost, Unit: reconcile.ConfigKey("web.service", filepath.Join(root, name)), Value: v}
	}
	snap := snapshot("good.service", "web.service")
	snap.Entries = append(snap.Entries, conf("a.conf", ""), conf("b.conf", "no-such-user:no-such-group"))
	a.SetSnapshot(snap)
	if _, err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	_, st := a.Statuses()
	for _, s := range st {
		refused := strings.Contains(s.Error, `no user "no-such-user"`) && strings.Contains(s.Error, filepath.Join(root, "b.conf"))
		if refused != (s.Unit == "web.service") {
			t.Errorf("%s: status error %q; only web.service's set has a refused file", s.Unit, s.Error)
		}
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("config files written from a refused set: %v", entries)
	}
	if _, exists, _ := units.Read("web.service"); exists {
		t.Error("web.service written though its set has a refused file")
	}
	if _, exists, _ := units.Read("good.service"); !exists {
		t.Error("good.service not written: one unit's refused set stopped another")
	}
	if slices.Contains(sd.Calls(), "start web.service") {
		t.Errorf("web.service started: %v", sd.Calls())
	}

	snap.Revision++
	snap.Entries = slices.Clone(snap.Entries)
	snap.Entries[len(snap.Entries)-1] = conf("b.conf", "")
	a.SetSnapshot(snap)
	if _, err := a.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, e := range snap.Entries {
		got, exists, err := files.Read(e.Unit)
		if err != nil || !exists || reconcile.Hash(got) != reconcile.Hash(e.Value) {
			t.Errorf("%s on disk: %q %v %v, want the registry's value", e.Unit, got, exists, err)
		}
	}
	_, st = a.Statuses()
	for _, s := range st {
		if s.Error != "" {
			t.Errorf("%s: %s", s.Unit, s.Error)
		}
	}
}
