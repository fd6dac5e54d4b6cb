package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentd/agentd/reconcile"
)

func TestAddConfigFiles(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "app.conf")
	if err := os.WriteFile(src, []byte("a=1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "bin")
	if err := os.WriteFile(bin, []byte{0, 1, 2}, 0o600); err != nil {
		t.Fatal(err)
	}
	const web = "[Service]\nExecStart=/bin/true\n"
	triggered := func(dest string) string { return web + "[X-Agentd]\nRestartTriggers=" + dest + "\n" }

	units := map[string][]byte{"web.service": []byte(web)}
	if err := addConfigFiles(units, []string{"/etc/myapp/app.conf=" + src + ":0640:root:adm", "/etc/myapp/b.conf=" + src}); err != nil {
		t.Fatal(err)
	}
	want := reconcile.ConfigFile{Mode: 0o640, Owner: "root:adm", Content: []byte("a=1\n")}.Encode()
	if got := units["web.service.files/etc/myapp/app.conf"]; string(got) != string(want) {
		t.Errorf("stored %q, want %q", got, want)
	}
	if got := units["web.service.files/etc/myapp/b.conf"]; !strings.HasPrefix(string(got), "#agentd-file mode=0644 owner=root:root\n") {
		t.Errorf("default mode and owner: %q", got)
	}

	// Among several units, the one whose trigger names the file.
	units = map[string][]byte{"web.service": []byte(web), "api.service": []byte(triggered("/etc/api.conf"))}
	if err := addConfigFiles(units, []string{"/etc/api.conf=" + src}); err != nil {
		t.Fatal(err)
	}
	if _, ok := units["api.service.files/etc/api.conf"]; !ok {
		t.Errorf("the file did not go to the unit whose trigger names it: %v", units)
	}
	// ... also when the trigger is in a drop-in of a unit the put has no
	// unit file of (one agentd did not install).
	units = map[string][]byte{"web.service": []byte(web), "vendor.service.d/10-env.conf": []byte("[X-Agentd]\nRestartTriggers=/etc/vendor.env\n")}
	if err := addConfigFiles(units, []string{"/etc/vendor.env=" + src}); err != nil {
		t.Fatal(err)
	}
	if _, ok := units["vendor.service.files/etc/vendor.env"]; !ok {
		t.Errorf("the file did not go to the unit whose drop-in's trigger names it: %v", units)
	}

	for spec, wantErr := range map[string]string{
		"/etc/x":                               "want DEST=SRC",
		"etc/x=" + src:                         "must be absolute",
		"/etc/../x=" + src:                     "not clean",
		"/etc/x/=" + src:                       "directory",
		"/etc/x=" + src + ":rw":                "not octal",
		"/etc/x=" + src + ":01234":             "1 to 4 octal digits",
		"/etc/x=" + src + ":0640:root":         "USER:GROUP",
		"/etc/x=" + src + ":0640:0:0":          "numeric IDs",
		"/etc/x=" + filepath.Join(dir, "nope"): "no such file",
		"/etc/x=" + dir:                        "not a regular file",
		"/etc/x=" + bin:                        "NUL",
	} {
		err := addConfigFiles(map[string][]byte{"web.service": []byte(web)}, []string{spec})
		if err == nil || !strings.Contains(err.Error(), wantErr) || exitCodeOf(err) != exitUsage {
			t.Errorf("--file %s: %v (exit %d), want a usage error naming %q", spec, err, exitCodeOf(err), wantErr)
		}
	}
	for name, tc := range map[string]struct {
		units map[string][]byte
		specs []string
		want  string
	}{
		"no unit":       {map[string][]byte{}, []string{"/etc/x=" + src}, "give the unit"},
		"several units": {map[string][]byte{"a.service": []byte(web), "b.service": []byte(web)}, []string{"/etc/x=" + src}, "no RestartTriggers="},
		"twice":         {map[string][]byte{"a.service": []byte(web)}, []string{"/etc/x=" + src, "/etc/x=" + src}, "given twice"},
		"both name it":  {map[string][]byte{"a.service": []byte(triggered("/etc/x")), "b.service": []byte(triggered("/etc/x"))}, []string{"/etc/x=" + src}, "belongs to one unit"},
	} {
		if err := addConfigFiles(tc.units, tc.specs); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}

// exitCodeOf is the exit code err carries (exitError when none).
func exitCodeOf(err error) int {
	var ce *codeError
	if asCode(err, &ce) {
		return ce.code
	}
	return exitError
}
