package unitdir

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// A hand edit, chmod or removal of a config file the agent wrote is
// reported under its key at once, also in a directory made after the
// watch began; a file the agent does not manage is not reported.
func TestRootsWatchReportsConfigFilesByKey(t *testing.T) {
	r, root := testRoots(t)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var got []string
	done := make(chan error, 1)
	go func() {
		done <- r.Watch(ctx, func(p string) {
			mu.Lock()
			got = append(got, p)
			mu.Unlock()
		})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Watch: %v", err)
		}
	}()
	time.Sleep(100 * time.Millisecond) // the watches are in place
	seen := func(want string) bool {
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			mu.Lock()
			for _, p := range got {
				if p == want {
					got = nil
					mu.Unlock()
					return true
				}
			}
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
		return false
	}

	app := filepath.Join(root, "app.conf")
	if err := r.Write(key(app), value(0o640, selfOwner(t), "a=1\n")); err != nil {
		t.Fatal(err)
	}
	seen(key(app)) // the agent's own write
	if err := os.Chmod(app, 0o644); err != nil {
		t.Fatal(err)
	}
	if !seen(key(app)) {
		t.Errorf("a chmod of %s was not reported under its key", app)
	}
	if err := os.WriteFile(app, []byte("a=2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if !seen(key(app)) {
		t.Errorf("an edit of %s was not reported under its key", app)
	}

	// A directory made after the watch began.
	deep := filepath.Join(root, "conf.d", "x.conf")
	if err := r.Write(key(deep), value(0o600, selfOwner(t), "x\n")); err != nil {
		t.Fatal(err)
	}
	seen(key(deep))
	time.Sleep(100 * time.Millisecond)
	if err := os.Remove(deep); err != nil {
		t.Fatal(err)
	}
	if !seen(key(deep)) {
		t.Errorf("the removal of %s (in a directory made after the watch began) was not reported", deep)
	}

	// Not the agent's: not reported.
	if err := os.WriteFile(filepath.Join(root, "other.conf"), []byte("o\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for _, p := range got {
		if p != "" && p != key(app) && p != key(deep) {
			t.Errorf("reported %q, a file the agent does not manage", p)
		}
	}
}
