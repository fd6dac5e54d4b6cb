package main

import (
	"errors"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// A bad --file-root refuses the start, before anything is opened, with a
// usage error that says what is wrong.
func TestRunRefusesBadFileRoot(t *testing.T) {
	base := t.TempDir()
	for _, tc := range []struct{ root, want string }{
		{"etc/myapp", "absolute"},
		{filepath.Join(base, "missing"), "no such file"},
		{base, "holds the unit directory"},
	} {
		o := &runOptions{host: "h1", groups: []string{"all"}, unitDir: filepath.Join(base, "units"), stateDir: filepath.Join(base, "state"),
			fileRoots: []string{tc.root}, logLevel: "error", logOut: io.Discard}
		_, err := newAgentRun(o)
		var ce *codeError
		if !errors.As(err, &ce) || ce.code != exitUsage || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--file-root %s: %v, want a usage error saying %q", tc.root, err, tc.want)
		}
	}
}
