package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentd/agentd/registry"
)

// keysOf lists e.host's unit keys in the registry.
func (e *env) keysOf() string {
	e.t.Helper()
	ls, err := e.reg.List(context.Background(), &registry.Target{Host: e.host})
	if err != nil {
		e.t.Fatal(err)
	}
	var ks []string
	for _, l := range ls {
		ks = append(ks, l.Unit)
	}
	return strings.Join(ks, " ")
}

// Issue 29, case 7: six units of 250 KiB in one put. The CLI says what is
// too large and what to do, exits 2, and nothing is stored — not the key,
// not its history.
func TestPutOverTheRequestLimitSaysSoPlainly(t *testing.T) {
	t.Parallel()
	e := newRegistryEnv(t)
	dir := t.TempDir()
	var files []string
	for i := range 6 {
		head := fmt.Sprintf("[Unit]\nDescription=big %d\n[Service]\nExecStart=/bin/true\n", i)
		pad := strings.Repeat("# a long comment that pads the unit file out to a quarter of a megabyte\n", (250<<10-len(head))/72)
		p := filepath.Join(dir, fmt.Sprintf("big%d.service", i))
		if err := os.WriteFile(p, []byte(head+pad), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, p)
	}
	out, code := e.cli(append([]string{"unit", "put", "--host", e.host}, files...)...)
	if code != exitUsage {
		t.Errorf("exit %d, want %d (usage: the put as given cannot be stored)", code, exitUsage)
	}
	want := "this put to hosts/h1 is 3.1 MB (6 keys, each with a copy in its history); the registry takes at most 1.5 MiB in one request (etcd's --max-request-bytes): split it, or raise the server's limit; nothing stored"
	if !strings.Contains(out, want) {
		t.Errorf("output:\n%s\nwant it to say:\n%s", out, want)
	}
	if strings.Contains(out, "rpc error") || strings.Contains(out, "ResourceExhausted") {
		t.Errorf("output has the gRPC error: %s", out)
	}
	if ks := e.keysOf(); ks != "" {
		t.Errorf("keys stored: %s", ks)
	}
	if h, err := e.reg.History(context.Background(), registry.Target{Host: e.host}, "big0.service"); err != nil || len(h.Versions) > 0 {
		t.Errorf("history of big0.service: %+v, %v; want none", h, err)
	}
	// The dry run says what the put would: the same refusal, not "start".
	if out, code := e.cli(append([]string{"unit", "put", "--dry-run", "--host", e.host}, files...)...); code != exitUsage || !strings.Contains(out, want) {
		t.Errorf("--dry-run: exit %d, want %d saying the put is refused:\n%s", code, exitUsage, out)
	}
	// Split in two, it is stored.
	for _, half := range [][]string{files[:3], files[3:]} {
		if out, code := e.cli(append([]string{"unit", "put", "--host", e.host}, half...)...); code != 0 {
			t.Fatalf("a put of three: exit %d\n%s", code, out)
		}
	}
}

// Issue 29, case 4, the CLI's half: rm of a unit whose drop-ins stay is
// refused, names them and changes nothing; naming them, or --recursive,
// removes the unit and its drop-ins in one transaction.
func TestUnitRmRefusesToLeaveDropIns(t *testing.T) {
	t.Parallel()
	e := newRegistryEnv(t)
	tg := registry.Target{Host: e.host}
	put := func() {
		if _, err := e.reg.Put(context.Background(), tg, map[string][]byte{
			"dd.service":          []byte(hv1),
			"dd.service.d/x.conf": []byte("[Service]\nEnvironment=X=1\n"),
			"dd.service.d/y.conf": []byte("[Service]\nEnvironment=Y=1\n"),
		}); err != nil {
			t.Fatal(err)
		}
	}
	put()
	all := e.keysOf()

	out, code := e.cli("unit", "rm", "dd.service", "--host", e.host)
	if code != exitUsage {
		t.Errorf("exit %d, want %d", code, exitUsage)
	}
	want := "drop-ins or config files in the registry for hosts/h1 would stay without their unit: dd.service has dd.service.d/x.conf, dd.service.d/y.conf; nothing removed (name them too, or give --recursive to remove each unit with all its drop-ins)"
	if !strings.Contains(out, want) {
		t.Errorf("output:\n%s\nwant it to say:\n%s", out, want)
	}
	if ks := e.keysOf(); ks != all {
		t.Errorf("keys after the refusal: %s, want %s", ks, all)
	}
	// One of them named: the other is still listed.
	if out, code := e.cli("unit", "rm", "dd.service", "dd.service.d/x.conf", "--host", e.host); code != exitUsage || !strings.Contains(out, "dd.service has dd.service.d/y.conf;") {
		t.Errorf("rm with one drop-in named: exit %d\n%s", code, out)
	}

	// All named: removed together.
	out, code = e.cli("unit", "rm", "dd.service", "dd.service.d/x.conf", "dd.service.d/y.conf", "--host", e.host)
	if code != 0 || e.keysOf() != "" {
		t.Fatalf("rm with its drop-ins named: exit %d, keys left %q\n%s", code, e.keysOf(), out)
	}

	// --recursive: the unit and every drop-in, in one transaction, each
	// printed.
	put()
	out, code = e.cli("unit", "rm", "dd.service", "--recursive", "--host", e.host)
	if code != 0 || e.keysOf() != "" {
		t.Fatalf("rm --recursive: exit %d, keys left %q\n%s", code, e.keysOf(), out)
	}
	var revs []string
	for _, k := range []string{"dd.service", "dd.service.d/x.conf", "dd.service.d/y.conf"} {
		i := strings.Index(out, "removed hosts/h1/units/"+k+" (revision ")
		if i < 0 {
			t.Fatalf("output does not say %s was removed:\n%s", k, out)
		}
		revs = append(revs, strings.SplitN(out[i:], "\n", 2)[0][len("removed hosts/h1/units/"+k):])
	}
	if revs[0] != revs[1] || revs[1] != revs[2] {
		t.Errorf("removed at revisions %v, want one transaction", revs)
	}
}
