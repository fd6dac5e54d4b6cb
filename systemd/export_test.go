package systemd

import (
	"context"

	"github.com/agentd/agentd/reconcile"
)

// ReadStateOnce is one read of a unit's state; with check, moved says the
// unit changed state under it (readState reads again then). Without, it is
// the read before that check was added.
func (m *Manager) ReadStateOnce(ctx context.Context, unit string, check bool) (s reconcile.UnitState, moved bool, err error) {
	c, err := m.conn(ctx)
	if err != nil {
		return s, false, err
	}
	return readStateOnce(ctx, c, unit, false, check)
}
