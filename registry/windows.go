package registry

import (
	"context"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/agentd/agentd/calendar"
)

// Maintenance windows of targets.
//
// Key layout:
//
//	<p>/windows/groups/<group>   the window's text (calendar.Window.String)
//
// A group (or selector target) with a window takes every staged change
// only inside it: the CLI and the git mirror read the window when they
// stage a write to the group and make the write a rollout that waits for
// it (rollout.Strategy.Window). The agents never read these keys: the
// rollout's record carries its window. A host target has no window: a
// write to one host is not staged.

func (c *Client) windowsRoot() string           { return c.prefix + "/windows/" }
func (c *Client) windowKey(group string) string { return c.windowsRoot() + "groups/" + group }

// SetWindow records w as group's maintenance window (replacing any).
func (c *Client) SetWindow(ctx context.Context, group string, w calendar.Window) error {
	if err := ValidateName("group", group); err != nil {
		return err
	}
	if w.IsZero() {
		return fmt.Errorf("%w window: empty (agentd window rm removes one)", ErrInvalid)
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	if _, err := c.cli.Put(rctx, c.windowKey(group), w.String()); err != nil {
		return fmt.Errorf("put %s: %w", c.windowKey(group), err)
	}
	return nil
}

// RemoveWindow removes group's window; false: it had none.
func (c *Client) RemoveWindow(ctx context.Context, group string) (bool, error) {
	if err := ValidateName("group", group); err != nil {
		return false, err
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Delete(rctx, c.windowKey(group))
	if err != nil {
		return false, fmt.Errorf("delete %s: %w", c.windowKey(group), err)
	}
	return resp.Deleted > 0, nil
}

// Window is group's window (false: none). A record that does not parse
// is an error naming it: a write to the group must not go out at once
// because its window was mistyped by hand.
func (c *Client) Window(ctx context.Context, group string) (calendar.Window, bool, error) {
	if err := ValidateName("group", group); err != nil {
		return calendar.Window{}, false, err
	}
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.Get(rctx, c.windowKey(group))
	if err != nil {
		return calendar.Window{}, false, fmt.Errorf("read %s: %w", c.windowKey(group), err)
	}
	if len(resp.Kvs) == 0 {
		return calendar.Window{}, false, nil
	}
	w, err := calendar.ParseWindow(string(resp.Kvs[0].Value))
	if err != nil {
		return calendar.Window{}, false, fmt.Errorf("%s: %w (agentd window set or rm mends it)", c.windowKey(group), err)
	}
	return w, true, nil
}

// Windows are every group's window, by group; a record that does not parse
// is given as its error.
func (c *Client) Windows(ctx context.Context) (map[string]calendar.Window, map[string]error, error) {
	rctx, cancel := c.reqCtx(ctx)
	defer cancel()
	root := c.windowsRoot() + "groups/"
	resp, err := c.cli.Get(rctx, root, clientv3.WithPrefix())
	if err != nil {
		return nil, nil, fmt.Errorf("list %s: %w", root, err)
	}
	ws, bad := map[string]calendar.Window{}, map[string]error{}
	for _, kv := range resp.Kvs {
		g := strings.TrimPrefix(string(kv.Key), root)
		w, err := calendar.ParseWindow(string(kv.Value))
		if err != nil {
			bad[g] = err
			continue
		}
		ws[g] = w
	}
	return ws, bad, nil
}
