package unitdir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"
)

// Watch reports changes in the unit directory (Dir.Watch) and, under the
// file roots, to the config files the agent has read or written, by key
// ("web.service.files/etc/myapp/app.conf"): a config file edited, chmodded
// or deleted by hand is drift, put back as soon as a unit file would be,
// not at the next periodic resync. A change of a file the agent does not
// manage is not reported. It returns when ctx ends, or with the first
// error of either watch.
func (r *Roots) Watch(ctx context.Context, onChange func(path string)) error {
	if len(r.roots) == 0 {
		return r.units.Watch(ctx, onChange)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2)
	go func() { errs <- r.units.Watch(ctx, onChange) }()
	go func() { errs <- r.watchRoots(ctx, onChange) }()
	err := <-errs
	cancel() // the other one ends too
	return errors.Join(err, <-errs)
}

// watchRoots watches every directory under the file roots (fsnotify is
// not recursive: each directory is added, and each one made later).
func (r *Roots) watchRoots(ctx context.Context, onChange func(path string)) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("watch the file roots: %w", err)
	}
	defer w.Close()
	addTree := func(top string) {
		// Symlinks are not followed (WalkDir does not): a config file is
		// never written through one.
		_ = filepath.WalkDir(top, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = w.Add(p) // a directory that went meanwhile: nothing to watch
			}
			return nil
		})
	}
	for _, fr := range r.roots {
		if err := w.Add(fr.path); err != nil {
			return fmt.Errorf("watch --file-root %s: %w", fr.path, err)
		}
		addTree(fr.path)
	}
	return follow(ctx, w, "the file roots", onChange, func(ev fsnotify.Event) {
		if ev.Has(fsnotify.Create) {
			addTree(ev.Name) // a new directory (a file: nothing added)
		}
		if strings.HasPrefix(filepath.Base(ev.Name), ".") {
			return // the agent's own temp files
		}
		if key, ok := r.keys.Load(ev.Name); ok {
			onChange(key.(string))
		}
	})
}
