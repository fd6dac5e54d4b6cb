package main

import (
	"context"

	"github.com/agentd/agentd/reconcile"
)

// sessionFacts is reconcile.FactsPublisher on the current registry
// session: before the agent has joined there is nothing to publish to, and
// the agent tries again (it costs no round trip).
type sessionFacts struct {
	r *sessionReporter
}

func (f sessionFacts) PublishFacts(ctx context.Context, facts reconcile.Facts) (<-chan struct{}, error) {
	s := f.r.current()
	if s == nil {
		return nil, errNotJoined
	}
	return s.PublishFacts(ctx, facts)
}
