package mirror

import (
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
)

const helloUnit = "[Unit]\nDescription=hello\n[Service]\nExecStart=/usr/local/bin/hello\n"

func TestRenderGoodTree(t *testing.T) {
	w := newWork(t)
	w.write("README.md", "# fleet\n", false)
	w.write(".github/workflows/ci.yml", "on: push\n", false)
	w.write("hosts/web1/hello.service", helloUnit, false)
	w.write("hosts/web1/hello.service.d/10-env.conf", "[Service]\nEnvironment=A=1\n", false)
	w.write("hosts/web1/hello.service.files/etc/hello/hello.conf", "greeting = hi\n", false)
	w.write("hosts/web1/hello.service.files/usr/local/bin/hello", "#!/bin/sh\necho hi\n", true)
	w.write("groups/web/app.service", helloUnit, false)
	w.write("groups/web/rollout.toml", "# how changes reach the group\ncanary = 1\nwaves = [\"50%\", \"100%\"] # cumulative\nsoak = \"2m\"\nmax_unavailable = \"20%\"\npause_after_canary = true\n", false)
	w.commit("", "fleet")
	tree, err := Render(w.head())
	if err != nil {
		t.Fatal(err)
	}
	want := Tree{
		{Host: "web1"}: {
			"hello.service":                            []byte(helloUnit),
			"hello.service.d/10-env.conf":              []byte("[Service]\nEnvironment=A=1\n"),
			"hello.service.files/etc/hello/hello.conf": []byte("#agentd-file mode=0644 owner=root:root\ngreeting = hi\n"),
			"hello.service.files/usr/local/bin/hello":  []byte("#agentd-file mode=0755 owner=root:root\n#!/bin/sh\necho hi\n"),
		},
		{Group: "web"}: {"app.service": []byte(helloUnit)},
	}
	if !maps.EqualFunc(tree, want, func(a, b map[string][]byte) bool {
		return maps.EqualFunc(a, b, func(x, y []byte) bool { return string(x) == string(y) })
	}) {
		t.Fatalf("Render =\n%q\nwant\n%q", tree, want)
	}
	ro, err := Rollouts(w.head())
	if err != nil {
		t.Fatal(err)
	}
	s := ro["web"]
	if len(ro) != 1 || s.Canary != (rollout.Count{N: 1}) || len(s.Waves) != 2 || s.Soak != 2*time.Minute ||
		s.MaxUnavailable != (rollout.Count{N: 20, Percent: true}) || !s.PauseAfterCanary || s.MaxRestarts != -1 {
		t.Fatalf("Rollouts = %+v", ro)
	}
}

// One bad file refuses the commit whole, each error naming its file.
func TestRenderRefuses(t *testing.T) {
	for _, tc := range []struct {
		name, path, content string
		want                string
	}{
		{"bad unit file", "hosts/web1/bad.service", "[Service\nExecStart=/bin/true\n", "hosts/web1/bad.service"},
		{"NUL in a config file", "hosts/web1/a.service.files/etc/a.conf", "a\x00b", "NUL"},
		{"file directly in hosts", "hosts/notes.txt", "hi\n", "directly in hosts/"},
		{"unexpected directory", "hosts/web1/extra/a.service", helloUnit, "hosts/web1/extra/a.service"},
		{"not a unit", "hosts/web1/notes.txt", "hi\n", "hosts/web1/notes.txt"},
		{"bad host name", "hosts/web 1/a.service", helloUnit, "host name"},
		{"rollout of a host", "hosts/web1/rollout.toml", "canary = 1\n", "belongs in groups/"},
		{"unknown rollout key", "groups/web/rollout.toml", "canary = 1\nwave = [1]\n", `line 2: unknown key "wave"`},
		{"reserved unit", "groups/web/agentd.service", helloUnit, "reserved unit"},
		{"too large", "groups/web/big.service", "[Service]\nEnvironment=A=" + strings.Repeat("x", 300<<10) + "\n", "limit"},
		{"hosts is a file", "hosts", "x\n", "want a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWork(t)
			if tc.path != "hosts" {
				w.write("hosts/ok/good.service", helloUnit, false)
			}
			w.write(tc.path, tc.content, false)
			w.commit("", tc.name)
			tree, err := Render(w.head())
			var re *RenderError
			if !errors.As(err, &re) || tree != nil {
				t.Fatalf("Render = %v, %v; want a *RenderError", tree, err)
			}
			if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), short(w.head().Hash)) {
				t.Fatalf("error %q does not say %q and the commit", err, tc.want)
			}
			if !strings.Contains(tc.path, " ") && tc.path != "hosts" && re.Path != tc.path {
				t.Errorf("RenderError.Path = %q, want %q", re.Path, tc.path)
			}
		})
	}
}

func TestRenderSymlinkRefused(t *testing.T) {
	w := newWork(t)
	w.write("hosts/web1/a.service", helloUnit, false)
	w.run(w.path+"/hosts/web1", nil, "ln", "-s", "a.service", "b.service")
	w.commit("", "link")
	if _, err := Render(w.head()); err == nil || !strings.Contains(err.Error(), "hosts/web1/b.service: a symbolic link") {
		t.Fatalf("Render = %v", err)
	}
}

func TestParseRollout(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"[rollout]\ncanary = 1\n", "sections"},
		{"canary = 1\ncanary = 2\n", "first on line 1"},
		{"canary = 0\n", "at least 1"},
		{"soak = 10m\n", "quoted"},
		{"soak = \"ten\"\n", "soak"},
		{"pause_after_canary = yes\n", "true or false"},
		{"pause_after_canary = true\n", "needs --canary"},
		{"waves = [\"50%\", \"10%\"]\n", "cumulative"},
		{"waves = 3\n", "list"},
		{"canary\n", "key = value"},
		{"waves_by = \"rack\"\nsuccess_threshold = \"90%\"\n", ""},
		{"waves_by = \"zone=a,b,c\"\n", ""},
		{"max_unavailable = 1\nbudget_by = \"rack\"\n", ""},
		{"budget_by = \"rack\"\n", "needs --max-unavailable"},
		{"window = \"Tue 02:00-04:00 Europe/Berlin\"\n", ""},
		{"window = \"Tue 25:00-04:00\"\n", "hour"},
		{"waves_by = rack\n", "quoted"},
		{"waves_by = \"zone=a,,b\"\n", "waves_by"},
		{"success_threshold = \"0%\"\n", "success_threshold"},
		{"waves_by = \"rack\"\nwaves = [\"100%\"]\n", "waves"},
	} {
		_, err := ParseRollout([]byte(tc.in))
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("ParseRollout(%q) = %v", tc.in, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("ParseRollout(%q) = %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestParseRolloutByLabel(t *testing.T) {
	s, err := ParseRollout([]byte("waves_by = \"zone=a,b\"\nsuccess_threshold = \"90%\"\n"))
	if err != nil || s.WavesBy != "zone" || strings.Join(s.WavesByOrder, ",") != "a,b" || s.SuccessThreshold != 90 {
		t.Errorf("ParseRollout: %+v, %v; want waves by zone a,b and a threshold of 90", s, err)
	}
}

func TestChangesAndGuard(t *testing.T) {
	web, db := registry.Target{Host: "web1"}, registry.Target{Group: "db"}
	current := Tree{web: {}, db: {}}
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		current[web][k+".service"] = []byte(k)
		current[db][k+".service"] = []byte(k)
	}
	clone := func() Tree {
		n := Tree{}
		for t, u := range current {
			n[t] = maps.Clone(u)
		}
		return n
	}

	next := clone()
	next[web]["a.service"] = []byte("A")
	next[web]["f.service"] = []byte("f")
	delete(next[db], "e.service")
	delete(next[db], "d.service")
	ch := Changes(current, next)
	if len(ch.Puts) != 1 || len(ch.Puts[web]) != 2 || string(ch.Puts[web]["a.service"]) != "A" {
		t.Errorf("puts = %q", ch.Puts)
	}
	if d := ch.Deletes[db]; len(ch.Deletes) != 1 || len(d) != 2 || d[0] != "d.service" || d[1] != "e.service" {
		t.Errorf("deletes = %v", ch.Deletes)
	}
	if f := ch.DeleteFraction(current); f != 0.2 {
		t.Errorf("DeleteFraction = %v, want 0.2", f)
	}
	if err := Guard(current, ch, DefaultDeleteThreshold); err != nil {
		t.Errorf("Guard at 2 of 10: %v", err)
	}
	if got := ch.Targets(); len(got) != 2 || got[0] != db || got[1] != web {
		t.Errorf("Targets = %v", got)
	}

	delete(next[web], "b.service")
	if err := Guard(current, Changes(current, next), DefaultDeleteThreshold); !errors.Is(err, ErrMassDelete) || !strings.Contains(err.Error(), "3 of the 10") {
		t.Errorf("Guard at 3 of 10 = %v, want ErrMassDelete", err)
	}
	// A target gone whole is its keys deleted.
	next = clone()
	delete(next, db)
	if ch := Changes(current, next); len(ch.Deletes[db]) != 5 || !errors.Is(Guard(current, ch, DefaultDeleteThreshold), ErrMassDelete) {
		t.Errorf("deleting a target: %v", ch.Deletes)
	}
	// An empty tree is a mass delete whatever the threshold.
	if err := Guard(current, Changes(current, Tree{}), 1); !errors.Is(err, ErrMassDelete) {
		t.Errorf("Guard(empty tree, threshold 1) = %v", err)
	}
	// Nothing mirrored yet: anything goes, and no change is empty.
	if err := Guard(Tree{}, Changes(Tree{}, current), 0); err != nil {
		t.Errorf("Guard(first mirror) = %v", err)
	}
	if ch := Changes(current, clone()); !ch.Empty() {
		t.Errorf("no change: %+v", ch)
	}
}
