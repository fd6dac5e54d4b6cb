package main

import (
	"bytes"
	"context"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseLabelsFile(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     map[string]string
		err      string // in the error; "" for none
	}{
		{"empty", "", map[string]string{}, ""},
		{"comments and blank lines", "# labels of web-01\n\n   \n  # indented comment\n", map[string]string{}, ""},
		{"one a line", "env=prod\nrack=r12\n", map[string]string{"env": "prod", "rack": "r12"}, ""},
		{"no final newline", "env=prod", map[string]string{"env": "prod"}, ""},
		{"spaces around", "  env = prod \t\n", map[string]string{"env": "prod"}, ""},
		{"CRLF", "env=prod\r\nrack=r1\r\n", map[string]string{"env": "prod", "rack": "r1"}, ""},
		{"empty value", "drain=\n", map[string]string{"drain": ""}, ""},
		{"prefixed key", "example.com/tier=db\n", map[string]string{"example.com/tier": "db"}, ""},
		{"= in no value", "env=a=b\n", nil, `labels:1: label value "a=b"`},
		{"no =", "env=prod\n\nrack\n", nil, `labels:3: "rack": want KEY=VALUE`},
		{"bad key", "# c\nEnv Name=prod\n", nil, "labels:2: label key"},
		{"bad value", "env=prod dev\n", nil, `labels:1: label value "prod dev"`},
		{"trailing comment is no comment", "env=prod # the env\n", nil, "labels:1: label value"},
		{"empty key", "=prod\n", nil, "labels:1: label key"},
		{"fact key", "env=prod\narch=arm64\n", nil, "labels:2: label arch is the host's own fact"},
		{"twice", "env=prod\nrack=r1\nenv=dev\n", nil, "labels:3: label env given twice (first at line 1)"},
		{"twice, same value", "env=prod\nenv=prod\n", nil, "labels:2: label env given twice"},
		{"value too long", "env=" + strings.Repeat("x", 64) + "\n", nil, "labels:1: label value"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseLabelsFile("labels", []byte(tc.in))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("parseLabelsFile(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || !maps.Equal(got, tc.want) {
				t.Fatalf("parseLabelsFile(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
			}
		})
	}
}

// TestReadLabelsFileSafety: only a file that nobody but root or the
// agent's user can change is obeyed; none is no labels.
func TestReadLabelsFileSafety(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name string, mode os.FileMode) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("env=prod\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // whatever the umask
			t.Fatal(err)
		}
		return p
	}
	if got, err := readLabelsFile(filepath.Join(dir, "none")); err != nil || got != nil {
		t.Errorf("no file: %v, %v; want no labels, no error", got, err)
	}
	if got, err := readLabelsFile(filepath.Join(dir, "nodir", "labels")); err != nil || got != nil {
		t.Errorf("no directory: %v, %v; want no labels, no error", got, err)
	}
	for _, mode := range []os.FileMode{0o644, 0o600, 0o444} {
		if got, err := readLabelsFile(write("ok", mode)); err != nil || got["env"] != "prod" {
			t.Errorf("mode %04o: %v, %v", mode, got, err)
		}
	}
	for _, mode := range []os.FileMode{0o664, 0o646, 0o666} {
		if _, err := readLabelsFile(write("wide", mode)); err == nil || !strings.Contains(err.Error(), "other users could write it") || !strings.Contains(err.Error(), "chmod go-w") {
			t.Errorf("mode %04o: %v, want a refusal saying chmod go-w", mode, err)
		}
	}
	// A directory others may write: they could rename another file in.
	open := filepath.Join(dir, "open")
	if err := os.Mkdir(open, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(open, 0o777); err != nil {
		t.Fatal(err)
	}
	inOpen := filepath.Join(open, "labels")
	if err := os.WriteFile(inOpen, []byte("env=prod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readLabelsFile(inOpen); err == nil || !strings.Contains(err.Error(), "(the directory of "+inOpen+") is mode 0777") {
		t.Errorf("in a 0777 directory: %v", err)
	}
	// A symlink is judged by what it points to, and where that lies.
	link := filepath.Join(dir, "link")
	if err := os.Symlink(inOpen, link); err != nil {
		t.Fatal(err)
	}
	if _, err := readLabelsFile(link); err == nil || !strings.Contains(err.Error(), "mode 0777") {
		t.Errorf("a link into a 0777 directory: %v", err)
	}
	if _, err := readLabelsFile(dir); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("a directory: %v", err)
	}
	if os.Geteuid() == 0 {
		theirs := write("theirs", 0o644)
		if err := os.Chown(theirs, 65534, 65534); err != nil {
			t.Fatal(err)
		}
		if _, err := readLabelsFile(theirs); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
			t.Errorf("another user's file: %v", err)
		}
	}
}

// TestCurrentLabelsReload: a good file replaces the file's labels and
// pokes the follower; a bad one (or one that gives a --label's key) is
// refused whole, logged once, and the labels stay; a removed file is no
// labels from it.
func TestCurrentLabelsReload(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "labels")
	put := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	if _, err := newCurrentLabels(map[string]string{"env": "prod"}, map[string]string{"env": "dev"}, path); err == nil ||
		!strings.Contains(err.Error(), "label env is given both with --label (env=prod) and in "+path+" (env=dev): give it in one place") {
		t.Fatalf("a key both ways: %v", err)
	}
	l, err := newCurrentLabels(map[string]string{"rack": "r1"}, nil, path)
	if err != nil {
		t.Fatal(err)
	}
	l.setFacts(map[string]string{"arch": "amd64"})
	poked := func() bool {
		select {
		case <-l.Changed():
			return true
		default:
			return false
		}
	}
	check := func(step string, want map[string]string, wantPoke bool, refused string) {
		t.Helper()
		if got := l.Get(); !maps.Equal(got, want) {
			t.Errorf("%s: labels %v, want %v", step, got, want)
		}
		if p := poked(); p != wantPoke {
			t.Errorf("%s: poked %v, want %v", step, p, wantPoke)
		}
		st := l.status()
		if (refused == "") != (st.FileRefused == "") || !strings.Contains(st.FileRefused, refused) {
			t.Errorf("%s: status says refused %q, want %q", step, st.FileRefused, refused)
		}
	}

	put("env=prod\n")
	l.reload(log)
	check("good file", map[string]string{"arch": "amd64", "rack": "r1", "env": "prod"}, true, "")
	l.Get()["env"] = "changed" // a copy
	l.reload(log)
	check("same file again", map[string]string{"arch": "amd64", "rack": "r1", "env": "prod"}, false, "")

	logs.Reset()
	put("env=dev\nbad line\n")
	l.reload(log)
	l.reload(log) // the resync: not logged again
	check("bad line", map[string]string{"arch": "amd64", "rack": "r1", "env": "prod"}, false, path+`:2: "bad line": want KEY=VALUE`)
	if n := strings.Count(logs.String(), "labels file refused"); n != 1 {
		t.Errorf("the refusal is logged %d times, want once:\n%s", n, logs.String())
	}
	put("env=dev\nrack=r2\n")
	l.reload(log)
	check("a --label's key", map[string]string{"arch": "amd64", "rack": "r1", "env": "prod"}, false, "label rack is given both with --label")
	put("env=dev\n")
	l.reload(log)
	check("fixed", map[string]string{"arch": "amd64", "rack": "r1", "env": "dev"}, true, "")
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	l.reload(log)
	check("world-writable", map[string]string{"arch": "amd64", "rack": "r1", "env": "dev"}, false, "mode 0666")
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	l.reload(log)
	check("removed", map[string]string{"arch": "amd64", "rack": "r1"}, true, "")
	if !strings.Contains(logs.String(), `msg="labels changed: rack=r1,arch=amd64"`) {
		t.Errorf("the last change is not logged:\n%s", logs.String())
	}
	var none *currentLabels
	if none.Get() != nil || none.Changed() != nil || none.status() != nil {
		t.Error("a nil *currentLabels has labels")
	}
}

// TestLabelsFileWatch: an editor's rename into place and a write in place
// are each seen, once settled.
func TestLabelsFileWatch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "labels")
	l, err := newCurrentLabels(nil, nil, path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); l.watch(ctx, slog.New(slog.NewTextHandler(t.Output(), nil))) }()
	defer func() { cancel(); <-done }()
	waitFor := func(want string) {
		t.Helper()
		select {
		case <-l.Changed():
		case <-time.After(5 * time.Second):
			t.Fatalf("no change seen within 5s; labels %v, want env=%s", l.Get(), want)
		}
		if got := l.Get()["env"]; got != want {
			t.Fatalf("env=%s, want env=%s", got, want)
		}
	}
	// A change before the watch is set up is read when it is: no wait here.
	tmp := filepath.Join(dir, ".labels.swp")
	if err := os.WriteFile(tmp, []byte("env=prod\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	waitFor("prod")
	if err := os.WriteFile(path, []byte("env=dev\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor("dev")
}

// TestLabelsFileAtStart: the agent refuses to start (exit 2) on a labels
// file it would refuse at run time, naming the line; AGENTD_LABELS_FILE
// (e.g. from /etc/default/agentd) sets the file; "" reads none.
func TestLabelsFileAtStart(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "labels")
	for _, tc := range []struct{ name, file, want string }{
		{"bad line", "env=prod\n\nenv prod\n", path + `:3: "env prod": want KEY=VALUE; the agent does not start`},
		{"fact", "os.id=debian\n", path + ":1: label os.id is the host's own fact"},
		{"both ways", "rack=r2\n", "label rack is given both with --label (rack=r1) and in " + path + " (rack=r2): give it in one place"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
				t.Fatal(err)
			}
			o := &runOptions{host: "h1", groups: []string{"all"}, unitDir: dir, stateDir: dir, logLevel: "info", logOut: t.Output(),
				labels: []string{"rack=r1"}, labelsFile: path}
			err := runAgent(t.Context(), o)
			var ce *codeError
			if err == nil || !asCode(err, &ce) || ce.code != exitUsage || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("runAgent: %v; want exit %d and %q", err, exitUsage, tc.want)
			}
		})
	}

	cmd := newRunCmd()
	if fl := cmd.Flags().Lookup("labels-file"); fl.DefValue != defaultLabelsFile {
		t.Errorf("--labels-file defaults to %q, want %q", fl.DefValue, defaultLabelsFile)
	}
	if err := applyEnvVars(cmd.Flags(), map[string]string{"AGENTD_LABELS_FILE": path}); err != nil {
		t.Fatal(err)
	}
	if got := cmd.Flags().Lookup("labels-file").Value.String(); got != path {
		t.Errorf("AGENTD_LABELS_FILE in the env file set --labels-file to %q, want %q", got, path)
	}
}
