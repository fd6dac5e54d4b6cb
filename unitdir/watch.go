package unitdir

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
)

// Watch reports changes to files in the directory and its drop-in
// subdirectories (<unit>.d/) until ctx ends, so hand edits of managed files
// are noticed at once rather than at the next periodic pass. onChange gets
// the path relative to the directory; the agent's own temp files (dot
// files) are not reported. It only notices: what to do is the caller's.
func (d *Dir) Watch(ctx context.Context, onChange func(path string)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", d.path, err)
	}
	defer w.Close()
	if err := w.Add(d.path); err != nil {
		return fmt.Errorf("watch %s: %w", d.path, err)
	}
	addDropIns := func() {
		entries, _ := os.ReadDir(d.path)
		for _, e := range entries {
			if e.IsDir() && strings.HasSuffix(e.Name(), ".d") {
				_ = w.Add(filepath.Join(d.path, e.Name()))
			}
		}
	}
	addDropIns()
	return follow(ctx, w, d.path, onChange, func(ev fsnotify.Event) {
		rel, err := filepath.Rel(d.path, ev.Name)
		if err != nil || strings.HasPrefix(filepath.Base(rel), ".") {
			return
		}
		if ev.Has(fsnotify.Create) && strings.HasSuffix(rel, ".d") && !strings.Contains(rel, "/") {
			if fi, err := os.Stat(ev.Name); err == nil && fi.IsDir() {
				_ = w.Add(ev.Name)
			}
		}
		onChange(filepath.ToSlash(rel))
	})
}

// follow hands w's events to onEvent until ctx ends. Events lost to an
// overflow are reported as onChange("") ("something changed"); any other
// error of the watch ends it, naming what is watched.
func follow(ctx context.Context, w *fsnotify.Watcher, what string, onChange func(string), onEvent func(fsnotify.Event)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			if err == fsnotify.ErrEventOverflow {
				onChange("")
				continue
			}
			return fmt.Errorf("watch %s: %w", what, err)
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			onEvent(ev)
		}
	}
}
