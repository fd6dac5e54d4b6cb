package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testlog"
	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
)

// Issue 26, item 3: commit-confirmed apply ([X-Agentd] ConfirmSec=, `unit
// put --confirm DUR`), against a real systemd and a real etcd.
//
// The agent reaches etcd through a TCP proxy that is itself a unit the
// agent manages (this test binary, proxyHelper): the proxy forwards to the
// address in its Environment=AGENTD_TEST_UPSTREAM. A change that points the
// proxy away cuts the agent off from its registry by its own doing.

// proxyHelperEnv makes the test binary a TCP proxy (TestMain): it listens
// on AGENTD_TEST_LISTEN, tells systemd READY=1 (Type=notify), and forwards
// every connection to AGENTD_TEST_UPSTREAM; a connection whose upstream
// cannot be reached is closed at once.
const proxyHelperEnv = "AGENTD_TEST_PROXY"

func proxyHelper() int {
	ln, err := net.Listen("tcp", os.Getenv("AGENTD_TEST_LISTEN"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "proxy helper:", err)
		return 1
	}
	if err := sdNotifyReady(); err != nil {
		fmt.Fprintln(os.Stderr, "proxy helper: notify:", err)
	}
	upstream := os.Getenv("AGENTD_TEST_UPSTREAM")
	for {
		c, err := ln.Accept()
		if err != nil {
			fmt.Fprintln(os.Stderr, "proxy helper:", err)
			return 1
		}
		go func() {
			defer c.Close()
			u, err := net.DialTimeout("tcp", upstream, time.Second)
			if err != nil {
				return
			}
			defer u.Close()
			var once sync.Once
			done := make(chan struct{})
			end := func() { once.Do(func() { close(done) }) }
			go func() { io.Copy(u, c); end() }()
			go func() { io.Copy(c, u); end() }()
			<-done
		}()
	}
}

// sdNotifyReady sends READY=1 to $NOTIFY_SOCKET (none: nothing to do).
func sdNotifyReady() error {
	sock := os.Getenv("NOTIFY_SOCKET")
	if sock == "" {
		return nil
	}
	if strings.HasPrefix(sock, "@") {
		sock = "\x00" + sock[1:]
	}
	c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte("READY=1"))
	return err
}

// proxyUnit is the proxy's unit file: it listens on listen and forwards to
// upstream; every start is recorded by its hook as "<MainPID> <upstream>"
// in events.
func proxyUnit(t *testing.T, listen, upstream, version, events string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return "[Unit]\nDescription=the agent's way to etcd (test proxy)\n[Service]\nType=notify\n" +
		"ExecStart=" + self + "\n" +
		"Environment=" + proxyHelperEnv + "=1 AGENTD_TEST_LISTEN=" + listen + " AGENTD_TEST_VERSION=" + version + "\n" +
		"Environment=AGENTD_TEST_UPSTREAM=" + upstream + "\n" +
		"ExecStartPost=/bin/sh -c 'echo \"$$MAINPID $$AGENTD_TEST_UPSTREAM\" >> " + events + "'\n" +
		"[X-Agentd]\nHealthySec=0\n"
}

// With ConfirmSec=2s (put --confirm 2s): a change of the proxy that keeps
// the agent's way to etcd (a restart, the connection cut for a moment) is
// confirmed and kept; a drop-in that points the proxy away cuts the agent
// off, and 2 s later the agent puts the previous set back by itself (the
// drop-in deleted, one daemon-reload, a restart), reaches etcd again, and
// reports "rolled-back: lost control plane" — `put --wait` exits 3 saying
// so. The drop-in, still in the registry, is not applied again; a unit
// without ConfirmSec= is never touched.
func TestConfirmLostControlPlaneRollsBack(t *testing.T) {
	t.Parallel() // waits on ConfirmSec= and etcd reconnects, not the CPU
	e := newEnv(t)
	events := filepath.Join(e.h.Dir, "proxy-starts")
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	upstream := strings.TrimPrefix(e.endpoint, "http://")
	nowhere := fmt.Sprintf("127.0.0.1:%d", freePort(t)) // nothing listens there
	const cp, away = "cp.service", "cp.service.d/away.conf"

	// The agent, straight to etcd, installs the proxy and a unit without
	// ConfirmSec=; then it restarts to reach etcd through the proxy.
	first := e.startAgent()
	e.put(cp, proxyUnit(t, listen, upstream, "v1", events), "--confirm", "2s")
	e.put("plain.service", helloV1)
	first.stop(t)
	logs := &testlog.Buffer{}
	e.startAgentOn([]string{"http://" + listen}, func(o *runOptions) { o.logOut = io.MultiWriter(t.Output(), logs) })
	eventually(t, "the agent, through the proxy, published its statuses", func() bool {
		_, ok := e.status(cp)
		return ok
	})
	plainPID := e.h.MainPID(t, "plain.service")

	// A change that keeps the way to etcd: confirmed, kept.
	t0 := time.Now()
	v2 := proxyUnit(t, listen, upstream, "v2", events)
	e.put(cp, v2, "--confirm", "2s") // --wait: returns once confirmed
	t.Logf("v2 applied and confirmed in %v", time.Since(t0).Round(time.Millisecond))
	pidV2 := e.h.MainPID(t, cp)
	if !environHas(pidV2, "AGENTD_TEST_VERSION=v2") || !environHas(pidV2, "AGENTD_TEST_UPSTREAM="+upstream) {
		t.Fatalf("v2 not running: MainPID %d", pidV2)
	}
	if s, _ := e.status(cp); s.Confirming || s.Action != "restart" || s.Error != "" || s.Health != "healthy" {
		t.Fatalf("status of the confirmed change: %+v", s)
	}
	if !strings.Contains(logs.String(), "cp.service: change confirmed by the control plane") {
		t.Fatalf("no journal line saying the change was confirmed:\n%s", logs)
	}
	if b, _ := e.readLocal(cp); !strings.Contains(b, "[X-Agentd]\nConfirmSec=2s\nHealthySec=0\n") {
		t.Fatalf("--confirm 2s did not put ConfirmSec=2s in the stored file:\n%s", b)
	}

	// The change that cuts the agent off.
	t1 := time.Now()
	out, code := e.cli("unit", "put", e.writeUnit(cp, v2), e.writeUnit(away, "[Service]\nEnvironment=AGENTD_TEST_UPSTREAM="+nowhere+"\n"),
		"--host", e.host, "--confirm", "2s", "--wait", "--timeout", "30s")
	took := time.Since(t1)
	t.Logf("the cut-off change reported rolled back after %v", took.Round(time.Millisecond))
	if code != exitFailed || !strings.Contains(out, "lost control plane") {
		t.Fatalf("put of the cut-off change: exit %d, want %d saying lost control plane\n%s", code, exitFailed, out)
	}
	if took < 2*time.Second {
		t.Errorf("rolled back %v after the put, before ConfirmSec=2s ran out", took)
	}

	// systemd's view: the proxy ran with the drop-in, and was restarted on
	// the previous set.
	b, _ := os.ReadFile(events)
	got := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(got) < 2 || !strings.HasSuffix(got[len(got)-2], " "+nowhere) || !strings.HasSuffix(got[len(got)-1], " "+upstream) {
		t.Fatalf("proxy starts %q: want one pointing away (%s), then one back on %s", got, nowhere, upstream)
	}
	pid := e.h.MainPID(t, cp)
	if pid == pidV2 || !environHas(pid, "AGENTD_TEST_UPSTREAM="+upstream) || !environHas(pid, "AGENTD_TEST_VERSION=v2") ||
		fmt.Sprint(pid) != strings.Fields(got[len(got)-1])[0] {
		t.Fatalf("MainPID %d (before the change %d): want a new process of v2 forwarding to %s; starts %q", pid, pidV2, upstream, got)
	}
	if st := e.h.ActiveState(t, cp); st != "active" {
		t.Fatalf("%s is %s after the rollback", cp, st)
	}
	if _, ok := e.readLocal(away); ok {
		t.Fatalf("%s still on disk after the rollback", away)
	}
	// The agent reached etcd again: its status (bound to its lease) says
	// why, and its membership is live.
	s, ok := e.status(cp)
	if !ok || s.Action != "rolled-back" || !strings.HasPrefix(s.Error, "lost control plane: the change was not confirmed within ConfirmSec=2s") || s.Confirming {
		t.Fatalf("status in etcd after the rollback: %+v", s)
	}
	if ms, err := e.reg.Members(context.Background()); err != nil || len(ms) != 1 || ms[0].Host != e.host {
		t.Fatalf("agent membership after the rollback: %+v %v", ms, err)
	}
	for _, want := range []string{"cp.service: confirming the change with the control plane", "cp.service: change failed, rolling back — lost control plane",
		"cp.service: change rolled back — lost control plane"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no journal line %q", want)
		}
	}

	// A full pass: the drop-in, still in the registry, is not applied again.
	if b, err := e.reg.Get(context.Background(), registry.Target{Host: e.host}, away); err != nil || len(b) == 0 {
		t.Fatalf("the drop-in is no longer in the registry: %q %v", b, err)
	}
	if out, code := e.cli("sync", "--debug-socket", e.agent.opts.debugSocket); code != 0 {
		t.Fatalf("sync: exit %d\n%s", code, out)
	}
	if _, ok := e.readLocal(away); ok {
		t.Fatalf("%s applied again after the rollback", away)
	}
	if p := e.h.MainPID(t, cp); p != pid {
		t.Fatalf("%s restarted again after the rollback: MainPID %d → %d", cp, pid, p)
	}
	if s, _ := e.status(cp); s.Action != "rolled-back" || !strings.HasPrefix(s.Error, "lost control plane") {
		t.Fatalf("status after a full pass: %+v", s)
	}
	if p := e.h.MainPID(t, "plain.service"); p != plainPID {
		t.Fatalf("plain.service (no ConfirmSec=) MainPID %d → %d", plainPID, p)
	}
}

// `unit put --confirm DUR` edits the files before anything else: a bad
// span, a put with no unit file and a unit the line would make invalid are
// refused (exit 2) with nothing stored.
func TestPutConfirmFlag(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	e := &env{t: t, host: "h1", endpoint: "http://127.0.0.1:1"} // nothing listens: each case fails before it connects
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"bad span", []string{write("a.service", helloV1), "--confirm", "5x"}, "bad ConfirmSec=5x"},
		{"infinity", []string{write("a.service", helloV1), "--confirm", "infinity"}, "bad ConfirmSec=infinity"},
		{"empty", []string{write("a.service", helloV1), "--confirm", ""}, "bad ConfirmSec=: want a time span"},
		{"two lines", []string{write("a.service", helloV1), "--confirm", "2s\nState=stopped"}, "one line"},
		{"drop-ins only", []string{write("a.service.d/x.conf", "[Service]\nEnvironment=A=1\n"), "--confirm", "2s"}, "no unit file to set ConfirmSec= in"},
		{"a stopped unit", []string{write("s.service", helloV1+"State=stopped\n"), "--confirm", "2s"}, "ConfirmSec= needs State=started"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.t = t
			out, code := e.cli(append([]string{"unit", "put"}, append(tc.args, "--host", "h1")...)...)
			if code != exitUsage || !strings.Contains(out, tc.want) {
				t.Fatalf("exit %d, want %d saying %q\n%s", code, exitUsage, tc.want, out)
			}
		})
	}
}

func TestSetConfirmSec(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"no section", "[Service]\nExecStart=/bin/true\n", "[Service]\nExecStart=/bin/true\n[X-Agentd]\nConfirmSec=30s\n"},
		{"no final newline", "[Service]\nExecStart=/bin/true", "[Service]\nExecStart=/bin/true\n[X-Agentd]\nConfirmSec=30s\n"},
		{"empty file", "", "[X-Agentd]\nConfirmSec=30s\n"},
		{"section, no key", "[Service]\nExecStart=/bin/true\n[X-Agentd]\nHealthySec=0\n", "[Service]\nExecStart=/bin/true\n[X-Agentd]\nConfirmSec=30s\nHealthySec=0\n"},
		{"key replaced", "[X-Agentd]\nHealthySec=0\nConfirmSec = 5s\n[Install]\nWantedBy=default.target\n", "[X-Agentd]\nConfirmSec=30s\nHealthySec=0\n[Install]\nWantedBy=default.target\n"},
		{"the same key elsewhere is left", "[Service]\nConfirmSec=1\n[X-Agentd]\nConfirmSec=1\n", "[Service]\nConfirmSec=1\n[X-Agentd]\nConfirmSec=30s\n"},
		{"two sections", "[X-Agentd]\nConfirmSec=1\n[Service]\nExecStart=/bin/true\n[X-Agentd]\nConfirmSec=2\n", "[X-Agentd]\nConfirmSec=30s\n[Service]\nExecStart=/bin/true\n[X-Agentd]\n"},
		{"header last, no newline", "[Service]\nExecStart=/bin/true\n[X-Agentd]", "[Service]\nExecStart=/bin/true\n[X-Agentd]\nConfirmSec=30s\n"},
		{"CRLF", "[Service]\r\nExecStart=/bin/true\r\n[X-Agentd]\r\nHealthySec=0\r\n", "[Service]\r\nExecStart=/bin/true\r\n[X-Agentd]\r\nConfirmSec=30s\r\nHealthySec=0\r\n"},
		{"ConfirmSecond is another key", "[X-Agentd]\nConfirmSecond=1\n", "[X-Agentd]\nConfirmSec=30s\nConfirmSecond=1\n"},
	} {
		got := string(setConfirmSec([]byte(tc.in), "30s"))
		if got != tc.want {
			t.Errorf("%s:\n got %q\nwant %q", tc.name, got, tc.want)
		}
		if p, err := reconcile.ParsePolicy([]byte(got)); tc.name != "ConfirmSecond is another key" && (err != nil || p.Confirm != 30*time.Second) {
			t.Errorf("%s: policy of the result %+v %v", tc.name, p, err)
		}
		if again := setConfirmSec([]byte(got), "30s"); !bytes.Equal(again, []byte(got)) {
			t.Errorf("%s: not idempotent: %q", tc.name, again)
		}
	}
}

// The agent is SIGKILLed right after it applied a change that cut it off
// (inside ConfirmSec=): the new agent, still cut off, finds the change
// awaiting its confirmation in its records, runs on its saved snapshot
// after 2 s instead of --registry-timeout (30 s), and puts the previous set
// back when ConfirmSec= runs out, by itself; then it reaches etcd and says
// why.
func TestConfirmSurvivesAgentSIGKILL(t *testing.T) {
	buildAgent(t) // before t.Parallel: buildAgent is not safe for concurrent use
	t.Parallel()
	s := newCrashScene(t, "confirm-kill")
	events := filepath.Join(s.h.Dir, "proxy-starts")
	listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	upstream := strings.TrimPrefix(s.endpoint, "http://")
	nowhere := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	const cp, away = "cp.service", "cp.service.d/away.conf"
	unit := string(setConfirmSec([]byte(proxyUnit(t, listen, upstream, "v1", events)), "3s"))

	a1 := s.agent()
	s.put(map[string]string{cp: unit})
	waitFor(t, a1, 30*time.Second, "the proxy runs", func() bool { return s.converged(cp, unit) })
	a1.stop(t)
	a2 := startCrashAgent(t, s.h, "http://"+listen, s.host)
	waitFor(t, a2, 30*time.Second, "the agent reports through the proxy", func() bool {
		st, err := s.reg.Statuses(context.Background(), s.host)
		return err == nil && st[cp].UpdatedAt.After(time.Now().Add(-time.Second))
	})

	s.put(map[string]string{cp: unit, away: "[Service]\nEnvironment=AGENTD_TEST_UPSTREAM=" + nowhere + "\n"})
	waitFor(t, a2, 30*time.Second, "the proxy points away", func() bool {
		return environHas(s.h.MainPID(t, cp), "AGENTD_TEST_UPSTREAM="+nowhere)
	})
	a2.kill()
	killed := time.Now()

	a3 := startCrashAgent(t, s.h, "http://"+listen, s.host)
	took := waitFor(t, a3, 30*time.Second, "the proxy is back on etcd, the drop-in gone", func() bool {
		_, err := os.Stat(filepath.Join(s.h.UnitDir, away))
		return os.IsNotExist(err) && environHas(s.h.MainPID(t, cp), "AGENTD_TEST_UPSTREAM="+upstream)
	})
	t.Logf("put back %v after the SIGKILL", took.Round(time.Millisecond))
	if took > 20*time.Second {
		t.Errorf("put back %v after the SIGKILL: the new agent waited out --registry-timeout", took)
	}
	waitFor(t, a3, 30*time.Second, "the status in etcd says lost control plane", func() bool {
		st, err := s.reg.Statuses(context.Background(), s.host)
		return err == nil && st[cp].Action == "rolled-back" && strings.HasPrefix(st[cp].Error, "lost control plane")
	})
	t.Logf("reported %v after the SIGKILL", time.Since(killed).Round(time.Millisecond))
}
