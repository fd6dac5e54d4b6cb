package secret

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPins(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config", "agentd", "known_recipients")
	p, err := LoadPins(path)
	if err != nil {
		t.Fatalf("missing pins file: %v, want empty pins", err)
	}
	a, b := newX25519(t).Recipient(), newSSH(t).Recipient()

	if st, _ := p.Check("web1", a); st != PinNew {
		t.Errorf("unknown host: %v, want new", st)
	}
	if err := p.Pin("web1", a); err != nil {
		t.Fatal(err)
	}
	if err := p.Pin("db1", b+" root@db1"); err != nil {
		t.Fatal(err)
	}
	if st, _ := p.Check("web1", a); st != PinSame {
		t.Errorf("pinned host, same recipient: %v, want same", st)
	}
	if st, _ := p.Check("db1", b); st != PinSame {
		t.Errorf("SSH recipient without its comment: %v, want same", st)
	}
	if st, pinned := p.Check("web1", b); st != PinChanged || pinned != a {
		t.Errorf("pinned host, other recipient: %v %q, want changed %q", st, pinned, a)
	}

	if err := p.Save(); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode() != 0o600 {
		t.Errorf("pins file mode %v, want 0600", fi.Mode())
	}
	if di, _ := os.Stat(filepath.Dir(path)); di.Mode().Perm() != 0o700 {
		t.Errorf("created directory mode %v, want 0700", di.Mode().Perm())
	}

	q, err := LoadPins(path)
	if err != nil {
		t.Fatal(err)
	}
	for host, r := range map[string]string{"web1": a, "db1": b} {
		if st, _ := q.Check(host, r); st != PinSame {
			t.Errorf("after save and load, %s: %v, want same", host, st)
		}
	}
	if err := q.Pin("web1", b); err != nil { // the operator accepted the change
		t.Fatal(err)
	}
	if err := q.Save(); err != nil {
		t.Fatal(err)
	}
	r, err := LoadPins(path)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := r.Check("web1", b); st != PinSame {
		t.Errorf("re-pinned host after save: %v, want same", st)
	}
}

func TestPinRefuses(t *testing.T) {
	t.Parallel()
	p, err := LoadPins(filepath.Join(t.TempDir(), "k"))
	if err != nil {
		t.Fatal(err)
	}
	a := newX25519(t).Recipient()
	for _, host := range []string{"", "two words", "#comment", "tab\there"} {
		if err := p.Pin(host, a); err == nil {
			t.Errorf("Pin(%q): no error", host)
		}
	}
	if err := p.Pin("web1", "nonsense"); err == nil {
		t.Error("Pin with a bad recipient: no error")
	}
}

func TestLoadRecipientsFile(t *testing.T) {
	t.Parallel()
	a, b := newX25519(t).Recipient(), newSSH(t).Recipient()
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	content := "# hosts\n\nweb1 " + a + "\n  db1\t" + b + " root@db1  \nweb1 " + a + "\n"
	if err := os.WriteFile(good, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	m, err := LoadRecipientsFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 2 || m["web1"] != a || m["db1"] != b {
		t.Errorf("got %q", m)
	}

	for name, tc := range map[string]struct {
		content string
		want    string
	}{
		"bad recipient": {"web1 " + a + "\n# c\nweb2 age1nope\n", ":3:"},
		"no recipient":  {"\nweb1\n", ":2:"},
		"two for one":   {"web1 " + a + "\nweb1 " + b + "\n", ":2: host web1 has another recipient on line 1"},
	} {
		path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-"))
		if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := LoadRecipientsFile(path)
		if err == nil || !strings.Contains(err.Error(), path+tc.want) {
			t.Errorf("%s: %v, want an error containing %q", name, err, path+tc.want)
		}
		// The pins file is read by the same parser: a bad line there is
		// an error too, not a host that looks new.
		if _, err := LoadPins(path); err == nil {
			t.Errorf("%s as a pins file: no error", name)
		}
	}
	if _, err := LoadRecipientsFile(filepath.Join(dir, "missing")); err == nil {
		t.Error("missing recipients file: no error")
	}
}

func TestDefaultPinsPath(t *testing.T) {
	t.Setenv("XDG_CONFIG_HOME", "/x/config")
	if p, err := DefaultPinsPath(); err != nil || p != "/x/config/agentd/known_recipients" {
		t.Errorf("with XDG_CONFIG_HOME: %q, %v", p, err)
	}
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("HOME", "/home/op")
	if p, err := DefaultPinsPath(); err != nil || p != "/home/op/.config/agentd/known_recipients" {
		t.Errorf("without XDG_CONFIG_HOME: %q, %v", p, err)
	}
}

func TestPinStateString(t *testing.T) {
	t.Parallel()
	for st, want := range map[PinState]string{PinNew: "new", PinSame: "same", PinChanged: "changed", 7: "PinState(7)"} {
		if got := st.String(); got != want {
			t.Errorf("%d: %q, want %q", int(st), got, want)
		}
	}
}
