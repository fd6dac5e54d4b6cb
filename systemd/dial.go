package systemd

import (
	"context"
	"os"
	"strconv"
	"time"

	sddbus "github.com/coreos/go-systemd/v22/dbus"
	godbus "github.com/godbus/dbus/v5"
)

// Dialer opens a new go-systemd connection. The context bounds the whole
// lifetime of the connection, not just the dial: when it is cancelled the
// connection closes (this is how go-systemd and godbus use it). Manager
// therefore dials with contexts of its own and cancels them to abandon a
// dial or drop a connection.
type Dialer func(ctx context.Context) (*sddbus.Conn, error)

// SystemDialer connects to the system manager through the system bus.
func SystemDialer() Dialer {
	return sddbus.NewSystemConnectionContext
}

// UserDialer connects to the user manager through the session bus found in
// $DBUS_SESSION_BUS_ADDRESS (else /run/user/<uid>/bus).
func UserDialer() Dialer {
	return sddbus.NewUserConnectionContext
}

// AddressDialer connects through the message bus at addr, e.g.
// "unix:path=/run/user/0/bus", authenticating as the current uid. Unlike
// UserDialer it does not read the process environment, so tests running in
// parallel can each talk to their own manager. addr must be a message bus
// (it sends Hello), not a manager's private socket.
func AddressDialer(addr string) Dialer {
	return func(ctx context.Context) (*sddbus.Conn, error) {
		return sddbus.NewConnection(func() (*godbus.Conn, error) {
			conn, err := godbus.Dial(addr, godbus.WithContext(ctx))
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
		})
	}
}

// conn is a go-systemd connection with the cancel func of the context it
// was dialed with.
type conn struct {
	*sddbus.Conn
	cancel context.CancelFunc
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
	type result struct {
		c   *sddbus.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		c, err := dial(cctx)
		ch <- result{c, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			cancel()
			return nil, r.err
		}
		return &conn{Conn: r.c, cancel: cancel}, nil
	case <-ctx.Done():
		// Cancelling cctx closes whatever the dial has opened or will open,
		// which also ends the dial goroutine.
		cancel()
		return nil, ctx.Err()
	}
}
