package unitdir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentd/agentd/reconcile"
)

// The marks survive a reopen; a file that does not parse is an error,
// never an empty set (which would accept every replay).
func TestSignedMarks(t *testing.T) {
	dir := t.TempDir()
	s, m, err := OpenSignedMarks(dir)
	if err != nil || len(m) != 0 {
		t.Fatalf("open empty: %v %v", m, err)
	}
	want := map[string]reconcile.Mark{"/agentd/hosts/h1/units/a.service": {Seq: 7, Hash: "ab"}, "/agentd/groups/g/units/b.service": {Seq: 9, Removed: true}}
	if err := s.Save(want); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if fi, err := os.Stat(filepath.Join(dir, marksFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", marksFile, fi.Mode(), err)
	}
	s, got, err := OpenSignedMarks(dir)
	if err != nil || len(got) != 2 || got["/agentd/hosts/h1/units/a.service"] != want["/agentd/hosts/h1/units/a.service"] || !got["/agentd/groups/g/units/b.service"].Removed {
		t.Fatalf("reopened: %v %v", got, err)
	}
	s.Close()
	os.WriteFile(filepath.Join(dir, marksFile), []byte("{"), 0o600)
	if _, _, err := OpenSignedMarks(dir); err == nil || !strings.Contains(err.Error(), marksFile) {
		t.Fatalf("corrupt file: %v", err)
	}
}
