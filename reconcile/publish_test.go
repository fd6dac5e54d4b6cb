package reconcile

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"
)

type recordingReporter struct {
	mu   sync.Mutex
	sets [][]Status
	err  error
}

func (r *recordingReporter) Report(_ context.Context, _ int64, st []Status) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.err != nil {
		return r.err
	}
	r.sets = append(r.sets, st)
	return nil
}

func (r *recordingReporter) reports() [][]Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([][]Status(nil), r.sets...)
}

func startPublisher(t *testing.T, r Reporter) *publisher {
	p := newPublisher(r, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return p
}

// A job that finishes quickly costs one write: its "running" status is
// replaced by the result before it is published. One that does not is
// published after coalesceJob. Newest wins; Sync's wait sees the write.
func TestPublisherCoalesces(t *testing.T) {
	r := &recordingReporter{}
	p := startPublisher(t, r)
	ctx := context.Background()

	p.offer(0, []Status{{Unit: "a.service", Job: "restart", Result: "running"}})
	time.Sleep(10 * time.Millisecond)
	gen := p.offer(0, []Status{{Unit: "a.service", Action: "restart", Result: "done"}})
	if err := p.published(ctx, gen); err != nil {
		t.Fatal(err)
	}
	if got := r.reports(); len(got) != 1 || got[0][0].Result != "done" {
		t.Fatalf("reports = %+v, want the result only", got)
	}

	start := time.Now()
	gen = p.offer(0, []Status{{Unit: "a.service", Job: "start", Result: "running"}})
	if err := p.published(ctx, gen); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < coalesceJob/2 {
		t.Errorf("a running job's status was published after %s, before waiting for its result", d)
	}
	if got := r.reports(); len(got) != 2 || got[1][0].Result != "running" {
		t.Fatalf("reports = %+v, want the running job published", got)
	}
}

// A failed write is reported to whoever waits for it, and retried.
func TestPublisherRetries(t *testing.T) {
	r := &recordingReporter{err: errors.New("etcd away")}
	p := startPublisher(t, r)
	gen := p.offer(0, []Status{{Unit: "a.service", Result: "done"}})
	if err := p.published(context.Background(), gen); err == nil {
		t.Fatal("published returned no error while etcd is away")
	}
	r.mu.Lock()
	r.err = nil
	r.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for len(r.reports()) == 0 {
		if time.Now().After(deadline) {
			t.Fatal("not retried")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
