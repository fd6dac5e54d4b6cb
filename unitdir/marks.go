package unitdir

import (
	"encoding/json"
	"fmt"

	"github.com/agentd/agentd/reconcile"
)

// marksFile holds, per registry key, the newest signed version the agent
// accepted (reconcile.Mark): what `agentd run --allowed-signers` compares
// a signature's sequence number with, so that an old signed version put
// back into the registry is refused as replayed, also after a restart.
const marksFile = "signed.json"

type marksJSON struct {
	Version int                       `json:"version"`
	Keys    map[string]reconcile.Mark `json:"keys"`
}

// SignedMarks is the state directory's signed.json (0600, written
// atomically). Not safe for concurrent use: the agent's loop alone saves.
type SignedMarks struct {
	dir *Dir
}

// OpenSignedMarks opens the marks in stateDir and returns what they hold
// (empty when the file does not exist). A file that does not parse is an
// error, never silently an empty one: that would accept every replay.
func OpenSignedMarks(stateDir string) (*SignedMarks, map[string]reconcile.Mark, error) {
	d, err := OpenPrivate(stateDir)
	if err != nil {
		return nil, nil, err
	}
	b, exists, err := d.Read(marksFile)
	if err != nil {
		d.Close()
		return nil, nil, err
	}
	marks := map[string]reconcile.Mark{}
	if exists {
		var mj marksJSON
		if err := json.Unmarshal(b, &mj); err != nil {
			d.Close()
			return nil, nil, fmt.Errorf("parse %s/%s: %w (move it away to accept, once, every signed version as new)", stateDir, marksFile, err)
		}
		if mj.Keys != nil {
			marks = mj.Keys
		}
	}
	return &SignedMarks{dir: d}, marks, nil
}

// Save replaces the marks with m.
func (s *SignedMarks) Save(m map[string]reconcile.Mark) error {
	b, err := json.Marshal(marksJSON{Version: 1, Keys: m})
	if err != nil {
		return err
	}
	if err := s.dir.Write(marksFile, append(b, '\n')); err != nil {
		return fmt.Errorf("save the signed versions accepted: %w", err)
	}
	return nil
}

// Close releases the state directory handle.
func (s *SignedMarks) Close() error { return s.dir.Close() }
