package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
)

// cliWarnings is the logger a registry client of a CLI command gets: its
// warnings (a registry key skipped because its value does not decode) go
// to w as "agentd: warning: …" lines; anything below warning level is
// dropped.
func cliWarnings(w io.Writer) *slog.Logger {
	return slog.New(&warnHandler{w: w, mu: &sync.Mutex{}})
}

type warnHandler struct {
	w     io.Writer
	mu    *sync.Mutex
	attrs []slog.Attr
}

func (h *warnHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }

func (h *warnHandler) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString("agentd: warning: ")
	b.WriteString(r.Message)
	add := func(a slog.Attr) bool {
		if a.Key == "err" {
			fmt.Fprintf(&b, " (%v)", a.Value.Any())
		}
		return true
	}
	for _, a := range h.attrs {
		add(a)
	}
	r.Attrs(add)
	b.WriteByte('\n')
	h.mu.Lock()
	defer h.mu.Unlock()
	_, err := io.WriteString(h.w, b.String())
	return err
}

func (h *warnHandler) WithAttrs(as []slog.Attr) slog.Handler {
	c := *h
	c.attrs = append(append([]slog.Attr(nil), h.attrs...), as...)
	return &c
}

func (h *warnHandler) WithGroup(string) slog.Handler { return h }
