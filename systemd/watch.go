package systemd

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	godbus "github.com/godbus/dbus/v5"
)

const (
	watchBackoffMin = 100 * time.Millisecond
	watchBackoffMax = 10 * time.Second
	// watchBuffer absorbs bursts (godbus delivers what does not fit from
	// goroutines of its own, so nothing is dropped).
	watchBuffer = 4096
	// watchMaxSeen bounds the memory of last-seen unit states.
	watchMaxSeen = 16384
)

// Watch reports unit state changes until ctx is done or the Manager is
// closed. It calls onChange(unit) for every change of a unit's ActiveState
// or SubState, and onChange("") — "anything may have changed: resync
// everything" — once the subscription is in place: at the start, after every
// reconnect (the bus drops on daemon-reexec over the private socket, or when
// the bus restarts). onChange runs on
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

// run subscribes on a bus connection of its own and forwards changes until
// the connection drops or ctx is done. subscribed tells whether it got as
// far as reporting "".
//
// It asks the bus only for what it reads: PropertiesChanged of the Unit
// interface (arg0) under systemd's unit objects. go-systemd's Subscribe
// also takes every type interface's PropertiesChanged and UnitNew: after
// a daemon-reload with 1,000 units that was ~2,000 signals for the agent
// to decode while systemd itself needed the CPU; this is half of it.
func (w *watcher) run(ctx context.Context) (subscribed bool, err error) {
	dctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	bctx, drop := context.WithCancel(ctx)
	defer drop()
	bc, err := dialBus(dctx, bctx, w.m.dial)
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer bc.Close()

	sigs := make(chan *godbus.Signal, watchBuffer)
	bc.Signal(sigs)
	if err := bc.AddMatchSignalContext(dctx,
		godbus.WithMatchInterface("org.freedesktop.DBus.Properties"),
		godbus.WithMatchMember("PropertiesChanged"),
		godbus.WithMatchPathNamespace(godbus.ObjectPath(strings.TrimSuffix(unitPathPrefix, "/"))),
		godbus.WithMatchArg(0, "org.freedesktop.systemd1.Unit"),
	); err != nil {
		return false, fmt.Errorf("subscribe: %w", err)
	}
	// Without a subscriber systemd sends no unit signals at all.
	if err := bc.Object("org.freedesktop.systemd1", managerPath).
		CallWithContext(dctx, "org.freedesktop.systemd1.Manager.Subscribe", 0).Err; err != nil {
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
		case sig, ok := <-sigs:
			if !ok {
				return true, errors.New("connection closed")
			}
			w.forward(seen, sig)
		case <-bc.Context().Done():
			return true, errors.New("connection closed")
		case <-ctx.Done():
			return true, ctx.Err()
		}
	}
}

// forward passes on a PropertiesChanged signal of a unit whose ActiveState
// or SubState changed.
func (w *watcher) forward(seen map[string]unitStates, sig *godbus.Signal) {
	unit, ok := unitOfPath(sig.Path)
	if !ok || len(sig.Body) < 2 {
		return
	}
	changed, ok := sig.Body[1].(map[string]godbus.Variant)
	if !ok {
		return
	}
	av, aok := changed["ActiveState"]
	sv, sok := changed["SubState"]
	if !aok && !sok {
		return
	}
	old, known := seen[unit]
	now := old
	if aok {
		v, _ := av.Value().(string)
		now.active = canonical(v)
	}
	if sok {
		v, _ := sv.Value().(string)
		now.sub = canonical(v)
	}
	if known && now == old {
		return
	}
	if len(seen) >= watchMaxSeen {
		clear(seen) // units come and go (transient ones); forgetting costs a few extra calls
	}
	seen[unit] = now
	w.onChange(unit)
}

const unitPathPrefix = "/org/freedesktop/systemd1/unit/"

// unitOfPath is the unit name of a unit object path: systemd escapes every
// byte outside [A-Za-z0-9] as _xx (sd_bus_path_encode).
func unitOfPath(p godbus.ObjectPath) (string, bool) {
	enc, ok := strings.CutPrefix(string(p), unitPathPrefix)
	if !ok || enc == "" || strings.Contains(enc, "/") {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(enc); i++ {
		if enc[i] != '_' {
			b.WriteByte(enc[i])
			continue
		}
		if i+2 >= len(enc) {
			return "", false
		}
		v, err := strconv.ParseUint(enc[i+1:i+3], 16, 8)
		if err != nil {
			return "", false
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), true
}
