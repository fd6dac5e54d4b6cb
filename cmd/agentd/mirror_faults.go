package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"github.com/agentd/agentd/registry"
)

// mirrorPauseEnv is a test-only fault of `agentd mirror`, for crash tests
// that SIGKILL the mirror mid-round: "before-write:N" pauses the round at
// its Nth commit write before it is sent, "after-write:N" once it is
// written and before the round goes on. The paused mirror writes
// <cache-dir>/<name>/paused-at-<point> and blocks until it is killed.
// Unset, nothing is wrapped.
const mirrorPauseEnv = "AGENTD_TEST_MIRROR_PAUSE"

// withMirrorFaults wraps s with the fault $AGENTD_TEST_MIRROR_PAUSE names;
// s itself when it names none.
func withMirrorFaults(s mirrorStore, dir string, log *slog.Logger) mirrorStore {
	v := os.Getenv(mirrorPauseEnv)
	if v == "" {
		return s
	}
	point, n, _ := strings.Cut(v, ":")
	at, err := strconv.Atoi(n)
	if (point != "before-write" && point != "after-write") || err != nil || at < 1 {
		log.Error("test fault: ignored", "env", mirrorPauseEnv, "value", v)
		return s
	}
	return &pausingStore{mirrorStore: s, point: point, at: at, dir: dir, log: log}
}

// pausingStore is a mirrorStore whose at-th ApplyCommit pauses at point.
type pausingStore struct {
	mirrorStore
	point string
	at    int
	dir   string
	log   *slog.Logger

	mu sync.Mutex
	n  int
}

func (p *pausingStore) ApplyCommit(ctx context.Context, mc registry.MirrorCommit) (int64, error) {
	p.mu.Lock()
	p.n++
	n := p.n
	p.mu.Unlock()
	if n == p.at && p.point == "before-write" {
		p.pause(mc)
	}
	rev, err := p.mirrorStore.ApplyCommit(ctx, mc)
	if n == p.at && p.point == "after-write" {
		p.pause(mc)
	}
	return rev, err
}

// pause marks the pause and blocks for good: the test kills the process.
func (p *pausingStore) pause(mc registry.MirrorCommit) {
	p.log.Warn("test fault: pausing the round", "at", p.point, "commit", short(mc.Commit))
	marker := filepath.Join(p.dir, "paused-at-"+p.point)
	if err := os.WriteFile(marker, []byte(fmt.Sprintln(mc.Commit)), 0o600); err != nil {
		p.log.Error("test fault", "err", err)
	}
	select {}
}
