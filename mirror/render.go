package mirror

import (
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/agentd/agentd/reconcile"
	"github.com/agentd/agentd/registry"
	"github.com/agentd/agentd/rollout"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/filemode"
	"github.com/go-git/go-git/v5/plumbing/object"
)

// Tree is what a commit renders to: for each host or group, its unit keys
// (the suffix after ".../units/": "web.service", "web.service.d/x.conf",
// "web.service.files/etc/web.conf") and their values, as `unit put` would
// store them.
type Tree map[registry.Target]map[string][]byte

// Keys is how many unit keys t holds.
func (t Tree) Keys() int {
	n := 0
	for _, units := range t {
		n += len(units)
	}
	return n
}

// RolloutFile is a group's rollout strategy in the repository:
// groups/<group>/rollout.toml.
const RolloutFile = "rollout.toml"

// maxPath bounds a path in the tree: a config file's destination is at
// most 1024 bytes, so anything far longer is refused before it is walked.
const maxPath = 2048

// RenderError says which file of a commit made it refused. A commit is
// rendered whole or not at all: a registry revision per commit must be
// the commit, not the part of it that passed.
type RenderError struct {
	Commit plumbing.Hash
	Path   string
	Err    error
}

func (e *RenderError) Error() string {
	return fmt.Sprintf("commit %s: %s: %v", short(e.Commit), e.Path, e.Err)
}

func (e *RenderError) Unwrap() error { return e.Err }

// Render maps c's tree to unit keys, 1:1:
//
//	hosts/<host>/<unit>                      → hosts/<host>/units/<unit>
//	hosts/<host>/<unit>.d/<name>.conf        → a drop-in
//	hosts/<host>/<unit>.files/<dest path>    → a config file for /<dest path>
//	groups/<group>/…                         → the same for a group
//	groups/<group>/rollout.toml              → the group's rollout strategy (Rollouts)
//
// A config file's value is its bytes behind the header `unit put --file`
// writes, mode 0755 when git has it executable, else 0644, owner root:root.
// Other top-level entries (README.md, .github/) are not the registry's and
// are ignored. Every file under hosts/ and groups/ is checked as `unit put`
// checks it (the name, the key, the content, the [X-Agentd] policy, the
// size); anything refused, or anything else there (a file directly in
// hosts/, a symbolic link, a submodule), refuses the whole commit: the
// error joins a *RenderError per file, in path order.
func Render(c *object.Commit) (Tree, error) {
	root, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("commit %s: tree: %w", short(c.Hash), err)
	}
	out := Tree{}
	var errs []error
	for _, e := range root.Entries {
		kind := strings.TrimSuffix(e.Name, "s") // host, group
		if e.Name != "hosts" && e.Name != "groups" {
			continue
		}
		if e.Mode != filemode.Dir {
			errs = append(errs, &RenderError{c.Hash, e.Name, fmt.Errorf("want a directory of %ss", kind)})
			continue
		}
		sub, err := root.Tree(e.Name)
		if err != nil {
			return nil, fmt.Errorf("commit %s: %s: %w", short(c.Hash), e.Name, err)
		}
		err = walk(sub, e.Name, func(path string, f *object.File) {
			if err := renderFile(out, kind, path, f); err != nil {
				errs = append(errs, &RenderError{c.Hash, path, err})
			}
		}, func(path string, err error) {
			errs = append(errs, &RenderError{c.Hash, path, err})
		})
		if err != nil {
			return nil, fmt.Errorf("commit %s: %w", short(c.Hash), err)
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// walk calls file for each regular file under t (named base/…) and bad for
// each entry that cannot be one (a link, a submodule, a path too long); an
// error is a tree that could not be read: the commit cannot be rendered at
// all, whatever its content.
func walk(t *object.Tree, base string, file func(string, *object.File), bad func(string, error)) error {
	for i := range t.Entries {
		e := &t.Entries[i]
		path := base + "/" + e.Name
		if len(path) > maxPath {
			bad(path[:64]+"…", fmt.Errorf("a path of %d bytes, over %d", len(path), maxPath))
			continue
		}
		switch e.Mode {
		case filemode.Dir:
			sub, err := t.Tree(e.Name)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			if err := walk(sub, path, file, bad); err != nil {
				return err
			}
		case filemode.Regular, filemode.Executable, filemode.Deprecated:
			f, err := t.TreeEntryFile(e)
			if err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			file(path, f)
		case filemode.Symlink:
			bad(path, errors.New("a symbolic link: store the file itself"))
		case filemode.Submodule:
			bad(path, errors.New("a submodule: store the files themselves"))
		default:
			bad(path, fmt.Errorf("unexpected git file mode %s", e.Mode))
		}
	}
	return nil
}

// renderFile checks one file of hosts/ or groups/ and adds its key to out.
func renderFile(out Tree, kind, path string, f *object.File) error {
	_, rest, _ := strings.Cut(path, "/")
	name, key, ok := strings.Cut(rest, "/")
	if !ok {
		return fmt.Errorf("a file directly in %ss/: want %ss/<name>/<unit file>", kind, kind)
	}
	if err := registry.ValidateName(kind, name); err != nil {
		return err
	}
	if f.Size > reconcile.MaxValueSize {
		return fmt.Errorf("%d bytes, over the registry's limit of %d KiB for one value", f.Size, reconcile.MaxValueSize>>10)
	}
	b, err := contents(f)
	if err != nil {
		return err
	}
	if key == RolloutFile {
		if kind != "group" {
			return errors.New("a rollout strategy stages a change across a group's hosts: it belongs in groups/<group>/rollout.toml")
		}
		_, err := ParseRollout(b)
		return err
	}
	if err := registry.ValidateUnit(key); err != nil {
		return err
	}
	value := b
	if reconcile.IsConfigPath(key) {
		mode := reconcile.DefaultMode
		if f.Mode == filemode.Executable {
			mode = 0o755
		}
		value = reconcile.ConfigFile{Mode: mode, Owner: reconcile.DefaultOwner, Content: b}.Encode()
		if len(value) > reconcile.MaxValueSize {
			return fmt.Errorf("%d bytes with its header, over the registry's limit of %d KiB for one value", len(value), reconcile.MaxValueSize>>10)
		}
	}
	if err := checkUnitFile(key, value); err != nil {
		return err
	}
	t := registry.Target{Host: name}
	if kind == "group" {
		t = registry.Target{Group: name}
	}
	if out[t] == nil {
		out[t] = map[string][]byte{}
	}
	out[t][key] = value
	return nil
}

// checkUnitFile is `unit put`'s check of a value (cmd/agentd's
// checkUnitFile): the key, the content, the syntax as systemd reads it and,
// for a unit file or drop-in, its [X-Agentd] policy.
func checkUnitFile(key string, value []byte) error {
	if err := reconcile.CheckValue(key, value); err != nil {
		return err
	}
	if reconcile.IsConfigPath(key) {
		return nil
	}
	_, err := reconcile.ParsePolicy(value)
	return err
}

func contents(f *object.File) ([]byte, error) {
	rd, err := f.Reader()
	if err != nil {
		return nil, err
	}
	defer rd.Close()
	return io.ReadAll(io.LimitReader(rd, reconcile.MaxValueSize+1))
}

// Rollouts reads each group's rollout.toml in c: the group's strategy for
// the changes this commit makes to it. Render has checked them already;
// Rollouts reads only these files.
func Rollouts(c *object.Commit) (map[string]rollout.Strategy, error) {
	root, err := c.Tree()
	if err != nil {
		return nil, fmt.Errorf("commit %s: tree: %w", short(c.Hash), err)
	}
	groups, err := root.Tree("groups")
	if errors.Is(err, object.ErrDirectoryNotFound) {
		return map[string]rollout.Strategy{}, nil
	} else if err != nil {
		return nil, fmt.Errorf("commit %s: groups: %w", short(c.Hash), err)
	}
	out := map[string]rollout.Strategy{}
	for _, e := range groups.Entries {
		if e.Mode != filemode.Dir {
			continue
		}
		path := "groups/" + e.Name + "/" + RolloutFile
		f, err := root.File(path)
		if errors.Is(err, object.ErrFileNotFound) {
			continue
		} else if err != nil {
			return nil, &RenderError{c.Hash, path, err}
		}
		b, err := contents(f)
		if err != nil {
			return nil, &RenderError{c.Hash, path, err}
		}
		s, err := ParseRollout(b)
		if err != nil {
			return nil, &RenderError{c.Hash, path, err}
		}
		out[e.Name] = s
	}
	return out, nil
}

// targets is m's targets in a stable order, by their key segment
// ("groups/a", …, "hosts/a", …).
func targets[V any](m map[registry.Target]V) []registry.Target {
	return slices.SortedFunc(maps.Keys(m), func(a, b registry.Target) int {
		return strings.Compare(a.String(), b.String())
	})
}
