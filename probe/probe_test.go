package probe

import (
	"context"
	"fmt"
	"github.com/agentd/agentd/internal/citest"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/agentd/agentd/reconcile"
)

func TestHTTP(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/ok", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("/boom", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) })
	mux.HandleFunc("/moved", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/boom", http.StatusFound) })
	mux.HandleFunc("/slow", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tls := httptest.NewTLSServer(mux) // a certificate no one signed: not verified
	defer tls.Close()
	ctx := context.Background()
	for _, tc := range []struct {
		url  string
		code int
	}{{srv.URL + "/ok", 200}, {srv.URL + "/boom", 500}, {srv.URL + "/moved", 302}, {tls.URL + "/ok", 200}} {
		if code, err := (Runner{}).HTTP(ctx, tc.url); err != nil || code != tc.code {
			t.Errorf("GET %s: %d %v, want %d", tc.url, code, err, tc.code)
		}
	}
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := (Runner{}).HTTP(tctx, srv.URL+"/slow"); err == nil {
		t.Error("a server that never answers: no error")
	}
	closed := freePort(t)
	if _, err := (Runner{}).HTTP(ctx, "http://"+closed+"/"); err == nil || strings.Contains(err.Error(), closed+"/") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Errorf("refused: %v, want the cause without the URL", err)
	}
}

func TestTCP(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ctx := context.Background()
	if err := (Runner{}).TCP(ctx, ln.Addr().String()); err != nil {
		t.Errorf("listening port: %v", err)
	}
	closed := freePort(t)
	if err := (Runner{}).TCP(ctx, closed); err == nil || err.Error() != "connect: connection refused" {
		t.Errorf("closed port: %v", err)
	}
}

func TestCommand(t *testing.T) {
	ctx := context.Background()
	run := func(argv ...string) error {
		return Runner{}.Command(ctx, reconcile.ProbeCommand{Unit: "web.service", Argv: argv})
	}
	if err := run("true"); err != nil {
		t.Errorf("true (looked up in PATH): %v", err)
	}
	if err := run("/bin/sh", "-c", "echo; echo '  not ready yet  '; echo second; exit 3"); err == nil || err.Error() != "exit status 3: not ready yet" {
		t.Errorf("exit 3: %v", err)
	}
	if err := run("/bin/sh", "-c", `test "$PATH" = "`+Path+`" && test "$AGENTD_UNIT" = web.service && test "$PWD" = / && test -z "$GOFLAGS"`); err != nil {
		t.Errorf("environment: %v", err)
	}
	if err := run("no-such-program-anywhere"); err == nil || !strings.Contains(err.Error(), "not found in "+Path) {
		t.Errorf("unknown program: %v", err)
	}
}

// A hung command is cut when ctx ends, with everything it started.
func TestCommandHungIsKilledWithItsGroup(t *testing.T) {
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	err := Runner{}.Command(ctx, reconcile.ProbeCommand{Argv: []string{"/bin/sh", "-c", "sleep 100 & echo $! > " + pidFile + "; wait"}})
	if err == nil || time.Since(t0) > 2*time.Second {
		t.Fatalf("hung command: %v after %v", err, time.Since(t0))
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid := strings.TrimSpace(string(b))
	deadline := time.Now().Add(2 * time.Second)
	for {
		stat, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(stat), ") Z ") {
			break // gone, or a zombie awaiting its reaper
		}
		if time.Now().After(deadline) {
			t.Fatalf("the command's child %s still runs: %s", pid, stat)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// User= and Group=: the command runs as them (the agent is root), with
// their supplementary groups only.
func TestCommandAsUser(t *testing.T) {
	citest.NeedRoot(t, "the probe command switches users")
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	sh := func(userName, group, script string) error {
		return Runner{}.Command(ctx, reconcile.ProbeCommand{Argv: []string{"/bin/sh", "-c", script}, User: userName, Group: group})
	}
	// Not root's groups: no 0 among them.
	if err := sh("nobody", "", fmt.Sprintf(`test "$(id -u)" = %s && test "$(id -g)" = %s && test "$USER" = nobody && test "$HOME" = %q && ! id -G | grep -qw 0`,
		nobody.Uid, nobody.Gid, nobody.HomeDir)); err != nil {
		t.Errorf("User=nobody: %v", err)
	}
	if err := sh(nobody.Uid, "0", fmt.Sprintf(`test "$(id -u)" = %s && test "$(id -g)" = 0`, nobody.Uid)); err != nil {
		t.Errorf("User=%s Group=0: %v", nobody.Uid, err)
	}
	if err := (Runner{}).Command(ctx, reconcile.ProbeCommand{Argv: []string{"true"}, User: "no-such-user-here"}); err == nil ||
		!strings.HasPrefix(err.Error(), "as User=no-such-user-here: ") {
		t.Errorf("unknown user: %v", err)
	}
}

// freePort returns a local address nothing listens on.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}
