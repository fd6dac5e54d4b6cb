// Package testlog holds the log sink of tests: a Buffer that the code under
// test (an agent's or a client's goroutines) writes to while the test reads
// what was written.
package testlog

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer behind a mutex: an io.Writer for a logger, read
// with String at any time. The zero value is ready to use; a Buffer is safe
// for concurrent use and must not be copied after first use.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
