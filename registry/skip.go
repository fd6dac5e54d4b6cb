package registry

import (
	"log/slog"
)

// Robust readers.
//
// Anyone with write access to the prefix can put anything at any key. A
// value that does not decode (a membership record, a status, a halt, a
// semaphore holder that is not JSON) or a key that does not have the
// expected shape is skipped with a warning naming the key: it never makes
// a reader fail, so one bad key cannot break `agentd hosts`, `unit put
// --wait`, the watch or the agent. Skipped keys are left in place, except
// under the agent's own status/<host>/ prefix, which every Session.Report
// rewrites to hold exactly the units it reports.

// SetLogger replaces the logger that receives the Client's warnings
// (skipped keys) and retry messages. Call it before the Client is used
// concurrently, e.g. right after Dial in a CLI command, to show the
// warnings on stderr.
func (c *Client) SetLogger(l *slog.Logger) {
	if l != nil {
		c.log = l
	}
}

// skipKey logs that key is left out of a read, and why.
func (c *Client) skipKey(key []byte, why string, err error) {
	args := []any{"key", string(key)}
	if err != nil {
		args = append(args, "err", err)
	}
	c.log.Warn("skipping registry key "+string(key)+": "+why, args...)
}
