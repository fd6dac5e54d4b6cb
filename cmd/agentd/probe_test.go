package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentd/agentd/internal/testlog"
)

// Issue 25, item 4: health probes in [X-Agentd], against a real systemd.
// The units serve HTTP with this test binary itself (serveHelper).

// serveHelperEnv makes the test binary a unit's server (TestMain): it
// listens on AGENTD_TEST_ADDR after AGENTD_TEST_DELAY and answers every
// request with AGENTD_TEST_STATUS. With AGENTD_TEST_READY_AFTER (a
// Type=notify unit) it answers 500 until then, and only then sends
// READY=1.
const serveHelperEnv = "AGENTD_TEST_SERVE"

func serveHelper() int {
	status, err := strconv.Atoi(os.Getenv("AGENTD_TEST_STATUS"))
	if err != nil {
		status = http.StatusOK
	}
	if d, err := time.ParseDuration(os.Getenv("AGENTD_TEST_DELAY")); err == nil {
		time.Sleep(d)
	}
	ln, err := net.Listen("tcp", os.Getenv("AGENTD_TEST_ADDR"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "serve helper:", err)
		return 1
	}
	var ready atomic.Bool
	ready.Store(true)
	if d, err := time.ParseDuration(os.Getenv("AGENTD_TEST_READY_AFTER")); err == nil {
		ready.Store(false)
		time.AfterFunc(d, func() {
			ready.Store(true)
			sock := os.Getenv("NOTIFY_SOCKET")
			if strings.HasPrefix(sock, "@") {
				sock = "\x00" + sock[1:]
			}
			c, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: sock, Net: "unixgram"})
			if err != nil {
				fmt.Fprintln(os.Stderr, "serve helper: notify:", err)
				return
			}
			c.Write([]byte("READY=1"))
			c.Close()
		})
	}
	err = http.Serve(ln, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(status)
		fmt.Fprintln(w, os.Getenv("AGENTD_TEST_VERSION"))
	}))
	fmt.Fprintln(os.Stderr, "serve helper:", err)
	return 1
}

// serveUnit is a service that serves HTTP on addr (with status, after
// delay, saying version) with policy in its [X-Agentd] section.
func serveUnit(t *testing.T, addr string, status int, delay time.Duration, version, policy string) string {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("[Service]\nType=exec\nExecStart=%s\n"+
		"Environment=%s=1 AGENTD_TEST_ADDR=%s AGENTD_TEST_STATUS=%d AGENTD_TEST_DELAY=%s AGENTD_TEST_VERSION=%s\n"+
		"[X-Agentd]\n%s", self, serveHelperEnv, addr, status, delay, version, policy)
}

// get fetches url and returns the status and body ("" on error).
func get(url string) (int, string) {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// (1) A version that is active but whose HealthURL answers 500 is judged
// failed within its window and rolled back to the one before: a new main
// PID serving the old version, the old file on disk, --wait exits 3 with
// the probe's result, status and log say why (one line for the verdict).
func TestHealthURLFailureRollsBack(t *testing.T) {
	t.Parallel() // waits on HealthySec and probes, not the CPU
	e := newEnv(t)
	logs := &testlog.Buffer{}
	e.startAgentOn([]string{e.endpoint}, func(o *runOptions) { o.logOut = io.MultiWriter(t.Output(), logs) })
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	url := "http://" + addr + "/healthz"
	policy := "HealthySec=1\nHealthURL=" + url + "\nHealthIntervalSec=200ms\nHealthRetries=3\n"
	v1 := serveUnit(t, addr, 200, 0, "v1", policy)
	v2 := serveUnit(t, addr, 500, 0, "v2", policy)

	t0 := time.Now()
	e.put("web.service", v1)
	t.Logf("v1 healthy after %v", time.Since(t0).Round(time.Millisecond))
	s, _ := e.status("web.service")
	if s.Health != "healthy" || s.Probe != "HealthURL "+url+": 200" {
		t.Fatalf("v1 status %+v: want healthy with the probe's 200", s)
	}
	pid1 := e.h.MainPID(t, "web.service")

	t0 = time.Now()
	out, code := e.cli("unit", "put", e.writeUnit("web.service", v2), "--host", e.host, "--wait", "--timeout", "30s")
	t.Logf("v2 judged and rolled back after %v", time.Since(t0).Round(time.Millisecond))
	probeFailed := "HealthURL " + url + ": 500 (want 2xx), 3 failures in a row (HealthRetries=3)"
	if code != exitFailed || !strings.Contains(out, "rolled back") || !strings.Contains(out, probeFailed) {
		t.Fatalf("put v2 --wait: exit %d, want %d saying rolled back and %q\n%s", code, exitFailed, probeFailed, out)
	}
	if got, _ := e.readLocal("web.service"); got != v1 {
		t.Fatalf("file on disk is not v1:\n%s", got)
	}
	pid := e.h.MainPID(t, "web.service")
	if pid == 0 || pid == pid1 || e.h.ActiveState(t, "web.service") != "active" {
		t.Fatalf("MainPID %d → %d (%s): want v1 started again", pid1, pid, e.h.ActiveState(t, "web.service"))
	}
	eventually(t, "v1 serves again", func() bool {
		c, body := get(url)
		return c == 200 && body == "v1"
	})
	s, _ = e.status("web.service")
	if s.Action != "rolled-back" || !strings.Contains(s.Error, "health probe failed after restart: "+probeFailed) {
		t.Fatalf("status %+v", s)
	}
	// v1's own probes run again, and pass.
	eventually(t, "v1's probe passes again", func() bool {
		s, _ := e.status("web.service")
		return s.Probe == "HealthURL "+url+": 200"
	})
	if n := strings.Count(logs.String(), "change failed, rolling back — health probe failed after restart: "+probeFailed); n != 1 {
		t.Fatalf("%d log lines for the verdict, want 1:\n%s", n, logs)
	}
}

// (2) A unit whose HealthTCP port opens only after a while passes: its
// probes fail while it starts, then pass, within HealthRetries.
func TestHealthTCPOpeningLatePasses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startAgent()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	delay := 1500 * time.Millisecond
	unit := serveUnit(t, addr, 200, delay, "v1", "HealthySec=500ms\nHealthTCP="+addr+"\nHealthIntervalSec=250ms\nHealthRetries=10\n")
	t0 := time.Now()
	e.put("late.service", unit)
	took := time.Since(t0)
	t.Logf("healthy after %v (the port opens after %v)", took.Round(time.Millisecond), delay)
	if took < delay {
		t.Fatalf("--wait returned after %v, before the port opened (%v)", took, delay)
	}
	s, _ := e.status("late.service")
	if s.Health != "healthy" || s.Error != "" || s.Probe != "HealthTCP "+addr+": connected" {
		t.Fatalf("status %+v", s)
	}
}

// Type=notify: no probe counts before systemd says active. The service
// answers 500 until it sends READY=1 (1.5 s after it starts); with
// HealthRetries=1 a single probe counted before READY would fail it.
func TestNotifyReadyBeforeProbes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startAgent()
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	url := "http://" + addr + "/"
	unit := strings.Replace(serveUnit(t, addr, 200, 0, "v1", "HealthySec=200ms\nHealthURL="+url+"\nHealthIntervalSec=100ms\nHealthRetries=1\n"),
		"Type=exec\n", "Type=notify\nEnvironment=AGENTD_TEST_READY_AFTER=1500ms\n", 1)
	t0 := time.Now()
	e.put("ready.service", unit)
	t.Logf("healthy after %v (READY=1 after 1.5s)", time.Since(t0).Round(time.Millisecond))
	s, _ := e.status("ready.service")
	if s.Health != "healthy" || s.Error != "" || s.Probe != "HealthURL "+url+": 200" {
		t.Fatalf("status %+v", s)
	}
}

// (3) A hung HealthCmd (sleep 100) is cut at HealthTimeoutSec, and the
// loop keeps serving other units meanwhile: another unit's change applies
// while the probe hangs.
func TestHungHealthCmdDoesNotBlockOtherUnits(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.startAgent()
	hung := "[Service]\nType=exec\nExecStart=/bin/sleep 1000\n[X-Agentd]\nHealthySec=0\nHealthCmd=/bin/sleep 100\nHealthTimeoutSec=3s\nHealthRetries=1\n"
	t0 := time.Now()
	if out, code := e.cli("unit", "put", e.writeUnit("hung.service", hung), "--host", e.host); code != 0 {
		t.Fatalf("put: exit %d\n%s", code, out)
	}
	var probePID int
	eventually(t, "the probe's sleep 100 runs", func() bool {
		probePID = childRunning("/bin/sleep\x00100\x00")
		return probePID != 0
	})
	t.Logf("probe started %v after the put", time.Since(t0).Round(time.Millisecond))

	t1 := time.Now()
	e.put("other.service", helloV1)
	took := time.Since(t1)
	s, _ := e.status("hung.service")
	t.Logf("another unit's change applied in %v while the probe hung", took.Round(time.Millisecond))
	if !s.Verifying || childRunning("/bin/sleep\x00100\x00") != probePID {
		t.Fatalf("hung.service %+v: want it still verifying, its probe (pid %d) still running", s, probePID)
	}
	if took > 2*time.Second {
		t.Fatalf("another unit's change took %v while a probe hung", took)
	}

	eventually(t, "the hung probe judged", func() bool {
		s, _ := e.status("hung.service")
		return s.Health == "unhealthy" && strings.HasPrefix(s.Error, "health probe failed after start: HealthCmd /bin/sleep 100: no answer within HealthTimeoutSec=3s")
	})
	judged := time.Since(t0)
	t.Logf("judged %v after the put (HealthTimeoutSec=3s)", judged.Round(time.Millisecond))
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(probePID))); err == nil && !zombie(probePID) {
		t.Fatalf("the hung probe (pid %d) still runs after its timeout", probePID)
	}
}

// childRunning returns the pid of a child of this process whose command
// line is cmdline (NUL-separated), 0 when none.
func childRunning(cmdline string) int {
	entries, _ := os.ReadDir("/proc")
	for _, d := range entries {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || string(b) != cmdline {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...
		f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
		if len(f) > 1 && f[1] == strconv.Itoa(os.Getpid()) && f[0] != "Z" {
			return pid
		}
	}
	return 0
}

func zombie(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	return err == nil && strings.Contains(string(stat), ") Z ")
}

// Bad probe keys are refused by `unit put` before anything is stored,
// with the key and the file named (exit 2): the policy parser the agent
// uses.
func TestPutRefusesBadProbeKeys(t *testing.T) {
	t.Parallel()
	e := newRegistryEnv(t)
	dir := t.TempDir()
	p := filepath.Join(dir, "web.service")
	for _, tc := range []struct{ policy, says string }{
		{"HealthURL=ftp://127.0.0.1/x", "bad HealthURL=ftp://127.0.0.1/x: want an http:// or https:// URL"},
		{"HealthUrl=http://127.0.0.1/", "unknown key HealthUrl= (the health keys are HealthySec and the probes' HealthCmd, HealthURL"},
		{"HealthTCP=127.0.0.1:80\nHealthIntervalSec=-2s", "bad HealthIntervalSec=-2s: want a time span"},
		{"HealthTCP=127.0.0.1:80\nHealthTimeoutSec=soon", "bad HealthTimeoutSec=soon: want a time span"},
		{"HealthTCP=127.0.0.1:80\nHealthRetries=0", "bad HealthRetries=0: want an integer ≥ 1"},
		{"HealthCmd=/bin/sh -c 'exit 0", "bad HealthCmd=/bin/sh -c 'exit 0: unterminated ' quote"},
	} {
		if err := os.WriteFile(p, []byte("[Service]\nExecStart=/bin/sleep 1000\n[X-Agentd]\n"+tc.policy+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		out, code := e.cli("unit", "put", p, "--host", "h1")
		if code != exitUsage || !strings.Contains(out, tc.says) || !strings.Contains(out, "web.service") {
			t.Errorf("put with %q: exit %d, want %d and %q:\n%s", tc.policy, code, exitUsage, tc.says, out)
		}
	}
	if listed, err := e.reg.List(context.Background(), nil); err != nil || len(listed) != 0 {
		t.Fatalf("after refused puts the registry holds %v (%v), want nothing", listed, err)
	}
}
