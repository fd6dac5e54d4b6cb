package systemd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
)

const (
	watchBackoffMin = 100 * time.Millisecond
	watchBackoffMax = 10 * time.Second
	// watchBuffer absorbs bursts. When it overflows go-systemd drops updates
	// and Watch asks for a full resync instead.
	watchBuffer = 1024
	// watchMaxSeen bounds the memory of last-seen unit states.
	watchMaxSeen = 16384
)

// Watch reports unit state changes until ctx is done or the Manager is
// closed. It calls onChange(unit) for every change of a unit's ActiveState
// or SubState, and onChange("") — "anything may have changed: resync
// everything" — once the subscription is in place: at the start, after every
// reconnect (the bus drops on daemon-reexec over the private socket, or when
// the bus restarts) and when updates had to be dropped. onChange runs on
// Watch's goroutine and must not block (poke a coalescing trigger).
//
// Watch uses a connection of its own (systemd's Subscribe plus
// PropertiesChanged signals; no polling of ListUnits). When it drops, Watch
// reconnects with backoff, and makes sure the Manager's call connection is
// up again before it reports "". Watch returns an error only when the first
// subscription fails; it returns nil when ctx is done and ErrClosed when the
// Manager was closed.
func (m *Manager) Watch(ctx context.Context, onChange func(unit string)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(m.life, cancel)()

	stopped := func() error {
		if m.life.Err() != nil {
			return ErrClosed
		}
		return nil
	}
	w := &watcher{m: m, onChange: onChange}
	backoff := watchBackoffMin
	for first := true; ; first = false {
		subscribed, err := w.run(ctx)
		if ctx.Err() != nil {
			return stopped()
		}
		if first && !subscribed {
			return fmt.Errorf("watch units: %w", err)
		}
		if subscribed {
			backoff = watchBackoffMin
		}
		// ±20% jitter, so agents do not all reconnect at once.
		d := time.Duration(float64(backoff) * (0.8 + 0.4*rand.Float64()))
		m.log.Warn("systemd watch interrupted; reconnecting", "err", err, "in", d.Round(time.Millisecond))
		select {
		case <-time.After(d):
		case <-ctx.Done():
			return stopped()
		}
		backoff = min(2*backoff, watchBackoffMax)
	}
}

type watcher struct {
	m        *Manager
	onChange func(string)
}

type unitStates struct{ active, sub string }

// run subscribes on a new connection and forwards changes until the
// connection drops or ctx is done. subscribed tells whether it got as far
// as reporting "".
func (w *watcher) run(ctx context.Context) (subscribed bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	c, err := dialConn(dctx, ctx, w.m.dial)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer c.close()

	updates := make(chan *sddbus.PropertiesUpdate, watchBuffer)
	errs := make(chan error, 1)
	c.SetPropertiesSubscriber(updates, errs)
	// Subscribe takes no context; closing the connection ends it.
	sub := make(chan error, 1)
	go func() { sub <- c.Subscribe() }()
	select {
	case err = <-sub:
	case <-dctx.Done():
		c.close()
		err = dctx.Err()
	}
	if err != nil {
		return false, fmt.Errorf("subscribe: %w", err)
	}
	// The resync below must find a working call connection.
	if _, err := w.m.conn(dctx); err != nil {
		return false, err
	}
	w.onChange("")

	// Last states seen, to forward only real ActiveState/SubState changes:
	// on any change of a unit (a job queued, a timestamp) systemd re-sends
	// all of its emits-change properties, these two included.
	seen := make(map[string]unitStates)
	for {
		select {
		case u := <-updates:
			w.forward(seen, u)
		case err := <-errs:
			// Our buffer overflowed and go-systemd dropped updates.
			w.m.log.Warn("systemd watch dropped updates; resyncing", "err", err)
			clear(seen)
			w.onChange("")
		case <-c.closed:
			return true, errors.New("connection closed")
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
}

func (w *watcher) forward(seen map[string]unitStates, u *sddbus.PropertiesUpdate) {
	av, aok := u.Changed["ActiveState"]
	sv, sok := u.Changed["SubState"]
	if !aok && !sok {
		return
	}
	old, known := seen[u.UnitName]
	now := old
	if aok {
		now.active, _ = av.Value().(string)
	}
	if sok {
		now.sub, _ = sv.Value().(string)
	}
	if known && now == old {
		return
	}
	if len(seen) >= watchMaxSeen {
		clear(seen) // units come and go (transient ones); forgetting costs a few extra calls
	}
	seen[u.UnitName] = now
	w.onChange(u.UnitName)
}
