package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/agentd/agentd/control"
	"github.com/agentd/agentd/reconcile"
)

// The labels file (agentd run --labels-file, default /etc/agentd/labels)
// holds labels that change without a restart of the agent: one KEY=VALUE
// a line, blank lines and lines starting with # skipped, each label
// checked as a --label is (no fact's key). Its labels are merged with
// --label's; a key given both ways is refused. The agent watches the file's
// directory (an editor's rename into place is seen), re-reads it 250 ms
// after the last change and every minute besides, and on new labels
// republishes its membership and joins or leaves the selector groups they
// match (selectorFollower). A file that does not parse, is not safe, or
// gives a key --label gives is refused as a whole: the agent keeps the
// labels it has, logs why once, and `agentd status` says so. At start such
// a file stops the agent (exit 2), as a bad --label does. No file is no
// labels from it.
//
// Who can write the file decides which selectors' units run here, as root:
// it must be a regular file owned by root or the agent's user, in a
// directory owned by one of them, neither writable by group or others.

// defaultLabelsFile is --labels-file's default.
const defaultLabelsFile = "/etc/agentd/labels"

// maxLabelsFile bounds what is read of a labels file.
const maxLabelsFile = 64 << 10

// How the labels file is followed: re-read labelsSettle after its last
// change event, and every labelsResync (jittered) whatever the events (a
// directory made after the start is watched from then on).
const (
	labelsSettle = 250 * time.Millisecond
	labelsResync = time.Minute
)

// parseLabelsFile parses a labels file's content; name is for errors,
// which name name:line.
func parseLabelsFile(name string, b []byte) (map[string]string, error) {
	labels := map[string]string{}
	lineOf := map[string]int{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	n := 0
	for sc.Scan() {
		n++
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			return nil, fmt.Errorf("%s:%d: %q: want KEY=VALUE", name, n, line)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if err := checkLabel(k, v); err != nil {
			return nil, fmt.Errorf("%s:%d: %w", name, n, err)
		}
		if first, dup := lineOf[k]; dup {
			return nil, fmt.Errorf("%s:%d: label %s given twice (first at line %d)", name, n, k, first)
		}
		labels[k], lineOf[k] = v, n
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s:%d: %w", name, n+1, err)
	}
	return labels, nil
}

// readLabelsFile reads the labels file at path: none there (nor its
// directory) is no labels and no error. A file that is not safe to obey
// (checkLabelsFile) or does not parse is an error.
func readLabelsFile(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if err := checkLabelsFile(path, fi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, maxLabelsFile+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(b) > maxLabelsFile {
		return nil, fmt.Errorf("%s is over %d bytes: not a labels file", path, maxLabelsFile)
	}
	return parseLabelsFile(path, b)
}

// checkLabelsFile checks that only root or the agent's user can change
// the labels file at path, fi being what was opened (symlinks followed):
// a regular file owned by one of them, not writable by group or others, in
// a directory (the link's target's) of the same kind.
func checkLabelsFile(path string, fi os.FileInfo) error {
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", path)
	}
	if err := notOthersWritable(path, "", fi); err != nil {
		return err
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return err
	}
	dir := filepath.Dir(real)
	di, err := os.Stat(dir)
	if err != nil {
		return err
	}
	return notOthersWritable(dir, " (the directory of "+path+")", di)
}

// notOthersWritable refuses fi (of path) unless root or this process's
// user owns it and neither group nor others may write it.
func notOthersWritable(path, what string, fi os.FileInfo) error {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Uid != 0 && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%s%s belongs to uid %d: only root or the agent's user may own the labels the agent obeys (chown root %s)", path, what, st.Uid, path)
	}
	if m := fi.Mode().Perm(); m&0o022 != 0 {
		return fmt.Errorf("%s%s is mode %04o: other users could write it and choose which selectors' units run here; chmod go-w %s", path, what, m, path)
	}
	return nil
}

// currentLabels are the agent's labels as they stand: the given ones
// (--label and the labels file) over the host's facts. Get is the one way
// to read them; the labels file's watcher changes them (watchLabelsFile),
// and Changed tells the one follower (selectorFollower). Safe for
// concurrent use; a nil *currentLabels has no labels.
type currentLabels struct {
	mu    sync.Mutex
	flag  map[string]string // --label
	file  map[string]string // the labels file, as last accepted
	facts map[string]string
	path  string // the labels file ("": none)
	// refused is why the labels file as it is now is refused ("": it is not).
	refused string
	changed chan struct{} // size 1: a poke for the follower
}

// newCurrentLabels are the labels given with --label (flag) and in the
// labels file at path (file, read at start), with no facts yet. A key in
// both is an error.
func newCurrentLabels(flag, file map[string]string, path string) (*currentLabels, error) {
	if err := disjointLabels(flag, file, path); err != nil {
		return nil, err
	}
	return &currentLabels{flag: flag, file: file, path: path, changed: make(chan struct{}, 1)}, nil
}

// disjointLabels refuses a key given both with --label and in the labels
// file.
func disjointLabels(flag, file map[string]string, path string) error {
	for _, k := range slices.Sorted(maps.Keys(file)) {
		if v, both := flag[k]; both {
			return fmt.Errorf("label %s is given both with --label (%s=%s) and in %s (%s=%s): give it in one place", k, k, v, path, k, file[k])
		}
	}
	return nil
}

// Get returns a copy of the labels the agent publishes now.
func (l *currentLabels) Get() map[string]string {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.getLocked()
}

func (l *currentLabels) getLocked() map[string]string {
	out := maps.Clone(l.facts)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, l.flag)
	maps.Copy(out, l.file)
	return out
}

// Changed receives after the labels changed (once for several changes).
func (l *currentLabels) Changed() <-chan struct{} {
	if l == nil {
		return nil
	}
	return l.changed
}

// setFacts sets the host's facts (read once the service manager answers).
func (l *currentLabels) setFacts(facts map[string]string) {
	l.mu.Lock()
	l.facts = maps.Clone(facts)
	l.mu.Unlock()
}

// status is what `agentd status` shows of the labels.
func (l *currentLabels) status() *control.LabelsInfo {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return &control.LabelsInfo{Labels: l.getLocked(), File: l.path, FileRefused: l.refused}
}

// reload reads the labels file again and takes its labels, or refuses it
// whole and keeps the labels as they are: logged once per reason, and
// again once accepted.
func (l *currentLabels) reload(log *slog.Logger) {
	file, err := readLabelsFile(l.path)
	l.mu.Lock()
	if err == nil {
		err = disjointLabels(l.flag, file, l.path)
	}
	was := l.getLocked()
	if err != nil {
		first := l.refused != err.Error()
		l.refused = err.Error()
		l.mu.Unlock()
		if first {
			log.Error("labels file refused: the host keeps its labels ("+err.Error()+")",
				"labels_file", l.path, "err", err, "labels", describeLabels(was, 1<<20))
		}
		return
	}
	wasRefused := l.refused != ""
	l.refused, l.file = "", file
	now := l.getLocked()
	l.mu.Unlock()
	if maps.Equal(was, now) {
		if wasRefused {
			log.Info("labels file accepted again; the labels are unchanged", "labels_file", l.path, "labels", describeLabels(now, 1<<20))
		}
		return
	}
	log.Info("labels changed: "+describeLabels(now, 1<<20), "labels_file", l.path, "labels", describeLabels(now, 1<<20), "was", describeLabels(was, 1<<20))
	select {
	case l.changed <- struct{}{}:
	default:
	}
}

// watchLabelsFile follows the labels file until ctx is done: it watches
// the file's directory and re-reads the file labelsSettle after the last
// event that names it (or the directory itself), and every labelsResync
// besides. Without the directory, or without inotify, the periodic
// re-read alone follows the file, and the watch is tried again each time.
func (l *currentLabels) watch(ctx context.Context, log *slog.Logger) {
	dir := filepath.Dir(l.path)
	var w *fsnotify.Watcher
	defer func() {
		if w != nil {
			w.Close()
		}
	}()
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	resync := time.NewTimer(reconcile.Jitter(labelsResync))
	defer resync.Stop()
	warned := false
	for {
		if w == nil {
			var err error
			if w, err = watchDir(dir); err != nil {
				if !warned && !errors.Is(err, os.ErrNotExist) {
					log.Warn("cannot watch the labels file's directory: its changes are read once a minute", "labels_file", l.path, "err", err)
					warned = true
				}
				w = nil
			} else {
				// Whatever changed while nothing watched.
				settle.Reset(labelsSettle)
			}
		}
		var events <-chan fsnotify.Event
		var errs <-chan error
		if w != nil {
			events, errs = w.Events, w.Errors
		}
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				w = nil
				continue
			}
			name := filepath.Clean(ev.Name)
			if name == dir && ev.Has(fsnotify.Remove|fsnotify.Rename) {
				w.Close()
				w = nil // watched again when it is back (resync)
			}
			if name == l.path || name == dir {
				settle.Reset(labelsSettle)
			}
		case _, ok := <-errs:
			if !ok {
				w = nil
				continue
			}
			settle.Reset(labelsSettle) // an overflow: events were lost
		case <-settle.C:
			l.reload(log)
		case <-resync.C:
			resync.Reset(reconcile.Jitter(labelsResync))
			l.reload(log)
		}
	}
}

// watchDir watches dir (not recursively).
func watchDir(dir string) (*fsnotify.Watcher, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, err
	}
	if err := w.Add(dir); err != nil {
		w.Close()
		return nil, err
	}
	return w, nil
}

// openLabels reads the labels file (--labels-file, made absolute) at
// start: a file refused now stops the agent. The labels have no facts yet
// (openLocal).
func (o *runOptions) openLabels() (*currentLabels, error) {
	var file map[string]string
	if o.labelsFile != "" {
		abs, err := filepath.Abs(o.labelsFile)
		if err != nil {
			return nil, fmt.Errorf("--labels-file: %w", err)
		}
		o.labelsFile = abs
		if file, err = readLabelsFile(abs); err != nil {
			return nil, fmt.Errorf("--labels-file: %w; the agent does not start", err)
		}
	}
	l, err := newCurrentLabels(o.given, file, o.labelsFile)
	if err != nil {
		return nil, fmt.Errorf("--labels-file: %w; the agent does not start", err)
	}
	return l, nil
}

// labelledBackend is what the debug socket serves, with the host's labels
// (`agentd status` shows them).
type labelledBackend struct {
	controlBackend
	labels *currentLabels
}

func (b labelledBackend) Labels() *control.LabelsInfo { return b.labels.status() }

// labelsLine is `agentd status`'s line of the host's labels.
func labelsLine(l *control.LabelsInfo) string {
	line := "labels " + describeLabels(l.Labels, 1<<20)
	if l.File != "" {
		line += " (labels file " + l.File + ")"
	}
	return line
}

// checkLabels is doctor's check of the labels file: the agent's own
// reading of it.
func checkLabels(o *runOptions) check {
	if o.labelsFile == "" {
		return check{"labels", checkOK, "no labels file (--labels-file \"\"): the labels are --label's and the host's facts", ""}
	}
	file, err := readLabelsFile(o.labelsFile)
	if err != nil {
		return check{"labels", checkFail, fmt.Sprintf("labels file refused: %v", err),
			"fix the file: a running agent keeps the labels it had until then, a starting one does not start"}
	}
	if _, err := os.Stat(o.labelsFile); errors.Is(err, os.ErrNotExist) {
		return check{"labels", checkOK, fmt.Sprintf("no labels file at %s: the labels are --label's and the host's facts", o.labelsFile), ""}
	}
	return check{"labels", checkOK, fmt.Sprintf("labels file %s gives %d label(s): %s", o.labelsFile, len(file), describeLabels(file, 1<<20)), ""}
}
