package systemd

import (
	"context"
	"os"
	"strconv"
	"sync"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// Dialer opens a bus connection, authenticated and introduced (Hello). The
// context bounds the whole lifetime of the connection, not just the dial:
// when it is cancelled the connection closes (this is how godbus uses it).
// Manager therefore dials with contexts of its own and cancels them to
// abandon a dial or drop a connection. It dials bus connections itself,
// rather than go-systemd connections, so it learns at once when one closes
// (godbus cancels the connection's Context) instead of polling.
type Dialer func(ctx context.Context) (*godbus.Conn, error)

// SystemDialer connects to the system manager through the system bus.
func SystemDialer() Dialer {
	return func(ctx context.Context) (*godbus.Conn, error) {
		return hello(godbus.SystemBusPrivate(godbus.WithContext(ctx)))
	}
}

// UserDialer connects to the user manager through the session bus found in
// $DBUS_SESSION_BUS_ADDRESS (else /run/user/<uid>/bus).
func UserDialer() Dialer {
	return func(ctx context.Context) (*godbus.Conn, error) {
		return hello(godbus.SessionBusPrivate(godbus.WithContext(ctx)))
	}
}

// AddressDialer connects through the message bus at addr, e.g.
// "unix:path=/run/user/0/bus", authenticating as the current uid. Unlike
// UserDialer it does not read the process environment, so tests running in
// parallel can each talk to their own manager. addr must be a message bus
// (it sends Hello), not a manager's private socket.
func AddressDialer(addr string) Dialer {
	return func(ctx context.Context) (*godbus.Conn, error) {
		return hello(godbus.Dial(addr, godbus.WithContext(ctx)))
	}
}

// hello authenticates as the current uid (EXTERNAL, no user name lookup)
// and introduces the connection to the bus.
func hello(conn *godbus.Conn, err error) (*godbus.Conn, error) {
	if err != nil {
		return nil, err
	}
	if err := conn.Auth([]godbus.Auth{godbus.AuthExternal(strconv.Itoa(os.Getuid()))}); err != nil {
		conn.Close()
		return nil, err
	}
	if err := conn.Hello(); err != nil {
		conn.Close()
		return nil, err
	}
	return conn, nil
}

// Connect opens a go-systemd connection through d, for callers that want
// go-systemd's API directly (tests, tools). ctx bounds its lifetime.
func Connect(ctx context.Context, d Dialer) (*sddbus.Conn, error) {
	c, err := dialConn(ctx, ctx, d)
	if err != nil {
		return nil, err
	}
	return c.Conn, nil
}

// dialBus dials one bus connection that lives until parent is done or it
// is closed. It stops waiting when ctx is done, abandoning the dial.
func dialBus(ctx, parent context.Context, dial Dialer) (*godbus.Conn, error) {
	type result struct {
		c   *godbus.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := dial(parent)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		return r.c, r.err
	case <-ctx.Done():
		// The caller cancels parent, which closes whatever the dial opens.
		return nil, ctx.Err()
	}
}

// conn is a go-systemd connection with the cancel func of the context it
// was dialed with, and a channel closed as soon as either of its two bus
// connections (calls, signals) closes.
type conn struct {
	*sddbus.Conn
	bus    *godbus.Conn // the bus connection of go-systemd's calls, for calls it has no method for
	cancel context.CancelFunc
	closed <-chan struct{}
}

func (c *conn) close() {
	c.Conn.Close()
	c.cancel()
}

// dialTimeout bounds a dial that nobody bounded (Watch's reconnects).
const dialTimeout = 15 * time.Second

// dialConn dials a connection that lives until parent is done or it is
// closed. It stops waiting when ctx is done, abandoning the dial.
func dialConn(ctx, parent context.Context, dial Dialer) (*conn, error) {
	cctx, cancel := context.WithCancel(parent)
	closed := make(chan struct{})
	var once sync.Once
	type result struct {
		c   *sddbus.Conn
		err error
	}
	ch := make(chan result, 1)
	var bus *godbus.Conn // written before ch is, read after
	go func() {
		c, err := sddbus.NewConnection(func() (*godbus.Conn, error) {
			b, err := dial(cctx)
			if err == nil && bus == nil {
				bus = b // go-systemd dials its call connection first (any would do for a call)
			}
			if err == nil {
				context.AfterFunc(b.Context(), func() { once.Do(func() { close(closed) }) })
			}
			return b, err
		})
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			cancel()
			return nil, r.err
		}
		return &conn{Conn: r.c, bus: bus, cancel: cancel, closed: closed}, nil
	case <-ctx.Done():
		// Cancelling cctx closes whatever the dial has opened or will open,
		// which also ends the dial goroutine.
		cancel()
		return nil, ctx.Err()
	}
}
