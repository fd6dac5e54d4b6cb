package reconcile

import (
	"io/fs"
	"strings"
	"testing"
)

func TestConfigFileRoundTrip(t *testing.T) {
	for _, f := range []ConfigFile{
		{Mode: 0o644, Content: []byte("a=1\n")},
		{Mode: 0o640, Owner: "app:app", Content: []byte("")},
		{Mode: ModeOf(0o2755), Owner: "root:adm", Content: []byte("x\ny")},
		{Mode: ModeOf(0o4711), Content: []byte("#agentd-file mode=0644 owner=a:b\n")}, // a header in the content is content
	} {
		b := f.Encode()
		g, err := DecodeConfigFile(b)
		if err != nil {
			t.Fatalf("%q: %v", b, err)
		}
		if f.Owner == "" {
			f.Owner = DefaultOwner
		}
		if g.Mode != f.Mode || g.Owner != f.Owner || string(g.Content) != string(f.Content) {
			t.Errorf("%q decoded to %+v, want %+v", b, g, f)
		}
	}
	if got := string(ConfigFile{Mode: ModeOf(0o2755), Owner: "a:b", Content: []byte("c")}.Encode()); got != "#agentd-file mode=2755 owner=a:b\nc" {
		t.Errorf("encode = %q", got)
	}
}

func TestDecodeConfigFileRefuses(t *testing.T) {
	for value, want := range map[string]string{
		"a=1\n":                                         "must begin with",
		"#agentd-file mode=0644":                        "must begin with", // no newline: no header line
		"#agentd-file mode=644 owner=a:b\nx":            "not in canonical form",
		"#agentd-file  mode=0644 owner=a:b\nx":          "not in canonical form",
		"#agentd-file mode=0648 owner=a:b\nx":           "not octal",
		"#agentd-file mode=10644 owner=a:b\nx":          "1 to 4 octal digits",
		"#agentd-file owner=a:b mode=0644\nx":           "unexpected",
		"#agentd-file mode=0644 owner=1000:1000\nx":     "numeric IDs",
		"#agentd-file mode=0644 owner=app\nx":           "USER:GROUP",
		"#agentd-file mode=0644 owner=a:b extra=1\nx":   "unexpected",
		"#agentd-file \nx":                              "want mode=NNNN owner=USER:GROUP",
		"#agentd-file mode=0644\nx":                     "want mode=NNNN owner=USER:GROUP",
		"#agentd-file mode=0644 owner=a;rm:b\nx":        "not allowed",
		"#agentd-file mode=0644 owner=-rf:b\nx":         "not allowed",
		"#agentd-file mode=0644 owner=a:b\r\nx":         "canonical",
		"#agentd-file mode=0644 owner=a:b mode=0600\nx": "unexpected",
	} {
		_, err := DecodeConfigFile([]byte(value))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", value, err, want)
		}
	}
}

func TestConfigKeys(t *testing.T) {
	key := ConfigKey("web.service", "/etc/myapp/app.conf")
	if key != "web.service.files/etc/myapp/app.conf" {
		t.Fatalf("key = %q", key)
	}
	if u, d, ok := ConfigDest(key); !ok || u != "web.service" || d != "/etc/myapp/app.conf" {
		t.Errorf("ConfigDest = %q %q %v", u, d, ok)
	}
	if UnitOfPath(key) != "web.service" || UnitOfPath("web.service.files/etc/conf.d/x.conf") != "web.service" {
		t.Errorf("UnitOfPath of a config file is not its unit")
	}
	if p, u, err := ParseKey(key); err != nil || p != key || u != "web.service" {
		t.Errorf("ParseKey = %q %q %v", p, u, err)
	}
	for key, want := range map[string]string{
		"web.service.files/etc/../root/x": "not clean",
		"web.service.files/etc//x":        "not clean",
		"web.service.files/etc/x/":        "directory",
		"web.service.files/":              "directory",
		"web.service.files/etc/a b":       "not allowed",
		"dbus.service.files/etc/x":        "dbus.service",
		"web.files/etc/x":                 "invalid",
	} {
		if _, _, err := ParseKey(key); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ParseKey(%q) = %v, want %q", key, err, want)
		}
	}
}

func TestParseMode(t *testing.T) {
	for s, want := range map[string]fs.FileMode{"644": 0o644, "0600": 0o600, "2755": 0o755 | fs.ModeSetgid, "7": 0o7} {
		if m, err := ParseMode(s); err != nil || m != want {
			t.Errorf("ParseMode(%q) = %v %v, want %v", s, m, err, want)
		}
	}
	for _, s := range []string{"", "rw", "0999", "12345", "-1"} {
		if _, err := ParseMode(s); err == nil {
			t.Errorf("ParseMode(%q) took it", s)
		}
	}
}

// conf is a config file's registry value.
func conf(content string) string {
	return string(ConfigFile{Mode: 0o644, Content: []byte(content)}.Encode())
}

func TestDesireConfigFilesAndTriggers(t *testing.T) {
	const app = "web.service.files/etc/myapp/app.conf"
	unit := svc + "[X-Agentd]\nRestartTriggers=/etc/myapp/app.conf\n"
	d := Desire(Snapshot{Entries: []Entry{entry("web.service", unit), entry(app, conf("a=1\n"))}})["web.service"]
	if d.Err != nil {
		t.Fatal(d.Err)
	}
	if d.Policy.RestartTriggers != "/etc/myapp/app.conf" || len(d.Files()) != 2 || len(d.UnitFiles()) != 1 {
		t.Errorf("policy %+v, files %d, unit files %d", d.Policy, len(d.Files()), len(d.UnitFiles()))
	}
	for name, es := range map[string][]Entry{
		"not a file of web.service's set": {entry("web.service", unit)},
		"must begin with":                 {entry("web.service", svc), entry(app, "a=1\n")},
		"bad ReloadTriggers=":             {entry("web.service", svc+"[X-Agentd]\nReloadTriggers=etc/x\n")},
	} {
		d := Desire(Snapshot{Entries: es})["web.service"]
		if d.Err == nil || !strings.Contains(d.Err.Error(), name) {
			t.Errorf("err = %v, want %q", d.Err, name)
		}
	}
}

// TestPlanConfigFileChange: a config file's change restarts or reloads its
// unit only when a trigger names it, and needs no daemon-reload.
func TestPlanConfigFileChange(t *testing.T) {
	const app = "web.service.files/etc/myapp/app.conf"
	const reloadable = svc + "ExecReload=/bin/true\n"
	tests := []struct {
		name   string
		unit   string
		want   Kind
		reason string
	}{
		{"no trigger: written, the unit left alone", svc, KindUpdate, "config files only, no daemon-reload, no job (only file /etc/myapp/app.conf (no trigger names it) changed"},
		{"RestartTriggers: restart", svc + "[X-Agentd]\nRestartTriggers=/etc/myapp/app.conf\n", KindRestart, "file /etc/myapp/app.conf (RestartTriggers=)"},
		{"ReloadTriggers on a unit that reloads: reload", reloadable + "[X-Agentd]\nReloadTriggers=/etc/myapp/app.conf\n", KindReload, "(ReloadTriggers=)"},
		{"ReloadTriggers on a unit that cannot: restart", svc + "[X-Agentd]\nReloadTriggers=/etc/myapp/app.conf\n", KindRestart, "cannot reload"},
		{"OnChange=none: pending", svc + "[X-Agentd]\nOnChange=none\nRestartTriggers=/etc/myapp/app.conf\n", KindUpdate, "restart pending"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			oldConf, newConf := conf("a=1\n"), conf("a=2\n")
			uh, oh := Hash([]byte(tt.unit)), Hash([]byte(oldConf))
			st := running
			cur := Current{
				Host: HostFacts{
					Files: map[string]LocalFile{
						"web.service": {Exists: true, Hash: uh, Content: []byte(tt.unit)},
						app:           {Exists: true, Hash: oh, Content: []byte(oldConf)},
					},
					Units: map[string]UnitState{"web.service": st},
				},
				Memory: Memory{
					Managed: map[string]Owned{"web.service": {Hash: uh}, app: {Hash: oh}},
					Records: map[string]UnitRecord{"web.service": {Applied: map[string]string{"web.service": uh, app: oh}}},
				},
			}
			plan := Plan(Desire(Snapshot{Entries: []Entry{entry("web.service", tt.unit), entry(app, newConf)}}), cur)
			a := plan[0]
			if a.Kind != tt.want || !strings.Contains(a.Reason, tt.reason) {
				t.Fatalf("kind = %s (%s), want %s with %q", a.Kind, a.Reason, tt.want, tt.reason)
			}
			if len(a.Steps.Writes) != 1 || a.Steps.Writes[0].Path != app {
				t.Errorf("writes = %v, want the config file only", a.Steps.Writes)
			}
			if r, why := ReloadNeeded(plan, cur); r {
				t.Errorf("a config file alone asked for a daemon-reload: %s", why)
			}
		})
	}
}

// Where a host takes config files is the planner's to say (RootOf), from
// the agent's roots or, for a preview, from the roots the host publishes.
func TestPlanConfigFileOutsideRoots(t *testing.T) {
	const app = "web.service.files/etc/myapp/app.conf"
	desired := Desire(Snapshot{Entries: []Entry{entry("web.service", svc), entry(app, conf("a=1\n"))}})
	for _, tc := range []struct {
		roots []string
		want  string // "" = planned, not blocked
	}{
		{nil, ""}, // unknown (a preview without facts): not judged here
		{[]string{"/etc/myapp"}, ""},
		{[]string{"/etc"}, ""},
		{[]string{"/etc/other", "/srv"}, "/etc/myapp/app.conf is outside every --file-root (/etc/other, /srv)"},
		{[]string{}, "this agent was started with none"},
		{[]string{"/etc/myapp/app.conf"}, "is a --file-root"},
		{[]string{"/etc/my"}, "outside every --file-root"}, // a prefix of a name is not a parent
	} {
		cur := Current{Host: HostFacts{Units: map[string]UnitState{"web.service": absent}, FileRoots: tc.roots}}
		a := Plan(desired, cur)[0]
		switch {
		case tc.want == "" && a.Kind == KindBlocked:
			t.Errorf("roots %v: blocked: %s", tc.roots, a.Err)
		case tc.want != "" && (a.Kind != KindBlocked || !strings.Contains(a.Err, tc.want)):
			t.Errorf("roots %v: %s %q, want blocked saying %q", tc.roots, a.Kind, a.Err, tc.want)
		}
	}
}
