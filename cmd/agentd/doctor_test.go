package main

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/unitdir"
)

// The shipped example environment file parses, and its settings reach the
// flags unless the command line or the environment set them.
func TestEnvFile(t *testing.T) {
	vars, err := readEnvFile("../../contrib/systemd/agentd.default")
	if err != nil || len(vars) != 0 {
		t.Fatalf("shipped agentd.default (all commented out): %v %v", vars, err)
	}
	p := filepath.Join(t.TempDir(), "agentd")
	os.WriteFile(p, []byte("# comment\n\nAGENTD_HOST=web-01\nAGENTD_GROUP=\"all,web\"\nAGENTD_STATE_DIR='/srv/agentd'\nAGENTD_UNIT_DIR=/from/file\nAGENTD_LOG_LEVEL=debug\n"), 0o644)
	vars, err = readEnvFile(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("AGENTD_LOG_LEVEL", "warn") // the environment wins over the file
	cmd := newDoctorCmd()
	o := &runOptions{}
	cmd.Flags().StringVar(&o.logLevel, "log-level", "info", "")
	if err := cmd.Flags().Parse([]string{"--unit-dir", "/from/flag"}); err != nil {
		t.Fatal(err)
	}
	if err := applyEnv(cmd); err != nil {
		t.Fatal(err)
	}
	if err := applyEnvVars(cmd.Flags(), vars); err != nil {
		t.Fatal(err)
	}
	get := func(name string) string { return cmd.Flags().Lookup(name).Value.String() }
	for name, want := range map[string]string{
		"host": "web-01", "group": "[all,web]", "state-dir": "/srv/agentd", "unit-dir": "/from/flag", "log-level": "warn",
	} {
		if got := get(name); got != want {
			t.Errorf("--%s = %q, want %q", name, got, want)
		}
	}
	os.WriteFile(p, []byte("AGENTD_HOST\n"), 0o644)
	if _, err := readEnvFile(p); err == nil || !strings.Contains(err.Error(), ":1:") {
		t.Errorf("bad line: %v", err)
	}
}

func TestRegistryFix(t *testing.T) {
	for msg, want := range map[string]string{
		"etcd at http://x:2379 unreachable within 5s (check --etcd-endpoints and the TLS flags): context deadline exceeded": "embedded etcd",
		"etcdserver: authentication failed, invalid user ID or password":                                                    "--etcd-password",
		"tls: failed to verify certificate: x509: certificate signed by unknown authority":                                  "--etcd-ca",
	} {
		if got := registryFix(errors.New(msg), true); !strings.Contains(got, want) {
			t.Errorf("fix for %q = %q, want it to mention %q", msg, got, want)
		}
	}
	if got := registryFix(errors.New("connection refused"), false); !strings.Contains(got, "--etcd-endpoints") {
		t.Errorf("fix = %q", got)
	}
}

func TestMemberCheck(t *testing.T) {
	ms := []reconcile.Member{{Host: "h1", MachineID: "m1", Version: "v1"}, {Host: "h2", MachineID: "m2"}}
	if c := memberCheck(ms, "h1", "m1"); c.Result != checkOK {
		t.Errorf("own member: %+v", c)
	}
	if c := memberCheck(ms, "h2", "m1"); c.Result != checkFail || !strings.Contains(c.Fix, "another name") {
		t.Errorf("name held by another machine: %+v", c)
	}
	if c := memberCheck(ms, "h3", "m1"); c.Result != checkWarn {
		t.Errorf("no agent: %+v", c)
	}
}

// The state directory check finds drift and missing files from the
// manifest, and a corrupt manifest.
func TestCheckStateDir(t *testing.T) {
	units, state := t.TempDir(), t.TempDir()
	o := &runOptions{unitDir: units, stateDir: state, host: "h1", groups: []string{"all"}}
	o.etcd.prefix = "/agentd"
	m, err := unitdir.OpenManifest(state)
	if err != nil {
		t.Fatal(err)
	}
	good, changed := []byte("[Service]\nExecStart=/bin/true\n"), []byte("[Service]\nExecStart=/bin/false\n")
	m.Set("good.service", reconcile.Owned{Hash: reconcile.Hash(good)})
	m.Set("drift.service", reconcile.Owned{Hash: reconcile.Hash(good)})
	m.Set("gone.service", reconcile.Owned{Hash: reconcile.Hash(good)})
	m.Set("web@1.service", reconcile.Owned{Instance: true})
	m.Close()
	os.WriteFile(filepath.Join(units, "good.service"), good, 0o644)
	os.WriteFile(filepath.Join(units, "drift.service"), changed, 0o644)

	checks := checkStateDir(o)
	text := checksText(checks)
	for _, want := range []string{"drift.service was changed behind agentd's back", "gone.service is missing", "no saved registry snapshot"} {
		if !strings.Contains(text, want) {
			t.Errorf("checks lack %q:\n%s", want, text)
		}
	}
	for _, c := range checks {
		if c.Result == checkFail {
			t.Errorf("unexpected failure: %+v", c)
		}
	}

	// A saved snapshot with a change journaled after it: the doctor tells
	// the revision the agent would fall back to, the journal's.
	l, err := openLastKnownGood(state, "h1", "/agentd", []string{"all"}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	l.received(reconcile.Snapshot{Revision: 5, Entries: []reconcile.Entry{{Unit: "good.service", Value: good}}}, func(reconcile.Snapshot) {})
	l.received(reconcile.Snapshot{Revision: 9, Entries: []reconcile.Entry{{Unit: "good.service", Value: good}, {Unit: "new.service", Value: good}}}, func(reconcile.Snapshot) {})
	l.Close()
	if text := checksText(checkStateDir(o)); !strings.Contains(text, "last-known-good registry snapshot: revision 9, 2 key(s)") {
		t.Errorf("checks after a journaled change:\n%s", text)
	}

	os.WriteFile(filepath.Join(state, "managed.json"), []byte("{not json"), 0o600)
	if c := checkStateDir(o); len(c) != 1 || c[0].Result != checkFail || !strings.Contains(c[0].Fix, "backup") {
		t.Errorf("corrupt manifest: %+v", c)
	}
	if c := checkUnitDir(o); c.Result != checkOK {
		t.Errorf("unit dir: %+v", c)
	}
	if entries, _ := os.ReadDir(units); len(entries) != 2 {
		t.Errorf("the writability probe left files behind: %v", entries)
	}
}

// The file roots check says none are given, refuses what the agent would
// refuse, and reads managed config files through the roots.
func TestCheckFileRoots(t *testing.T) {
	base := t.TempDir()
	units, state, root := filepath.Join(base, "units"), filepath.Join(base, "state"), filepath.Join(base, "myapp")
	for _, d := range []string{units, state, root} {
		os.Mkdir(d, 0o755)
	}
	o := &runOptions{unitDir: units, stateDir: state}
	if c := checksText(checkFileRoots(o)); !strings.Contains(c, "no --file-root") {
		t.Errorf("no roots:\n%s", c)
	}
	o.fileRoots = []string{base}
	if c := checkFileRoots(o); len(c) != 1 || c[0].Result != checkFail || !strings.Contains(c[0].Detail, "holds the unit directory") {
		t.Errorf("a root holding the unit directory: %+v", c)
	}
	o.fileRoots = []string{root}
	if c := checkFileRoots(o); len(c) != 1 || c[0].Result != checkOK {
		t.Errorf("a good root: %+v", c)
	}
	if entries, _ := os.ReadDir(root); len(entries) != 0 {
		t.Errorf("the writability probe left files behind: %v", entries)
	}

	conf := reconcile.ConfigFile{Mode: 0o640, Content: []byte("x=1\n")}.Encode()
	m, err := unitdir.OpenManifest(state)
	if err != nil {
		t.Fatal(err)
	}
	m.Set(reconcile.ConfigKey("web.service", filepath.Join(root, "app.conf")), reconcile.Owned{Hash: reconcile.Hash(conf)})
	m.Close()
	os.WriteFile(filepath.Join(root, "app.conf"), []byte("x=1\n"), 0o640)
	os.Chmod(filepath.Join(root, "app.conf"), 0o640)
	if text := checksText(checkStateDir(o)); !strings.Contains(text, "all present with the content agentd wrote") {
		t.Errorf("a managed config file under its root:\n%s", text)
	}
	o.fileRoots = nil
	if text := checksText(checkStateDir(o)); !strings.Contains(text, "outside every --file-root") || !strings.Contains(text, "AGENTD_FILE_ROOT") {
		t.Errorf("a managed config file without its root:\n%s", text)
	}
}

func checksText(cs []check) string {
	var b bytes.Buffer
	printChecks(&b, cs)
	return b.String()
}

// The clock skew comes from the Date header; its resolution is 1 s.
func TestEtcdClockSkew(t *testing.T) {
	offset := 10 * time.Second
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/health" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Date", time.Now().Add(offset).UTC().Format(http.TimeFormat))
		w.Write([]byte(`{"health":"true"}`))
	}))
	defer srv.Close()
	o := &runOptions{}
	skew, _, err := etcdClockSkew(t.Context(), o, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if d := skew - offset; d < -time.Second || d > time.Second {
		t.Errorf("skew %s, want %s ± 1s", skew, offset)
	}
	if c := checkClock(t.Context(), o, srv.URL, false); c.Result != checkWarn || !strings.Contains(c.Fix, "synchronize") {
		t.Errorf("10s skew: %+v", c)
	}
	offset = 0
	if c := checkClock(t.Context(), o, srv.URL, false); c.Result != checkOK {
		t.Errorf("no skew: %+v", c)
	}
}

// `agentd completion bash` is cobra's, and works; --help of every command
// documents the exit codes or points at them.
func TestCompletionAndHelp(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish"} {
		var out bytes.Buffer
		root := newRoot()
		root.SetArgs([]string{"completion", shell})
		root.SetOut(&out)
		if err := root.Execute(); err != nil || !strings.Contains(out.String(), "agentd") || out.Len() < 1000 {
			t.Errorf("completion %s: %v (%d bytes)", shell, err, out.Len())
		}
	}
	var out bytes.Buffer
	root := newRoot()
	root.SetArgs([]string{"--help"})
	root.SetOut(&out)
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Exit codes:", "doctor", "completion", "AGENTD_<FLAG>"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("agentd --help lacks %q", want)
		}
	}
	out.Reset()
	root = newRoot()
	root.SetArgs([]string{"run", "--help"})
	root.SetOut(&out)
	root.Execute()
	if s := out.String(); !strings.Contains(s, "--metrics-addr") || !strings.Contains(s, "--registry-timeout") || strings.Contains(s, "test-wedge-file") {
		t.Errorf("agentd run --help:\n%s", s)
	}
}
