// STUB of the registry's mirror API (issue 35), so that cmd/agentd builds
// before the real one lands (worktree wt-mregistry). Every body panics.
// Drop this commit at merge: the real registry/mirror.go replaces it.
package registry

import (
	"context"
	"errors"
	"time"
)

type MirrorState struct {
	Name, URL, Branch               string
	Commit, Signer, Author, Subject string
	At                              time.Time
	Revision                        int64
	Refused                         *MirrorRefusal
}

type MirrorRefusal struct {
	Commit, Author, Reason string
	At                     time.Time
}

func (c *Client) MirrorState(ctx context.Context, name string) (MirrorState, bool, error) {
	panic("stub")
}

func (c *Client) MirrorTree(ctx context.Context, name string) (map[Target]map[string][]byte, error) {
	panic("stub")
}

type MirrorCommit struct {
	Name, URL, Branch               string
	Parent                          string
	Commit, Signer, Author, Subject string
	Puts                            map[Target]map[string][]byte
	Deletes                         map[Target][]string
	Owned                           []Target
	Leader                          *MirrorLeader
}

func (c *Client) ApplyCommit(ctx context.Context, mc MirrorCommit) (int64, error) { panic("stub") }

var (
	ErrMirrorMoved = errors.New("stub: mirror moved")
	ErrNotLeader   = errors.New("stub: not leader")
	ErrMirrored    = errors.New("stub: mirrored")
)

func (c *Client) RefuseCommit(ctx context.Context, name string, r MirrorRefusal) error {
	panic("stub")
}

func (c *Client) ResetMirror(ctx context.Context, name, to, who string) error { panic("stub") }

type MirrorLeader struct{}

func (c *Client) CampaignMirror(ctx context.Context, name, id string, ttl time.Duration) (*MirrorLeader, error) {
	panic("stub")
}

func (l *MirrorLeader) Done() <-chan struct{} { panic("stub") }

func (l *MirrorLeader) Resign(ctx context.Context) error { panic("stub") }

type SyncRequest struct {
	AllowMassDelete bool
	By              string
	At              time.Time
}

func (c *Client) RequestMirrorSync(ctx context.Context, name string, r SyncRequest) error {
	panic("stub")
}

func (c *Client) WatchMirrorSync(ctx context.Context, name string) <-chan SyncRequest {
	panic("stub")
}

func (c *Client) MirrorOwner(ctx context.Context, t Target) (name, url string, ok bool, err error) {
	panic("stub")
}

func Force() WriteOption { panic("stub") }
