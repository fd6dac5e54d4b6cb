package registry

import (
	"context"
	"fmt"
	"slices"
)

// ClientURLs returns the client URLs the etcd members advertise, sorted and
// without duplicates: for the embedded etcd, each of its listeners (its
// unix socket, its https:// listener, a plaintext http:// one). doctor
// reads them to say which doors to the registry are open.
func (c *Client) ClientURLs(ctx context.Context) ([]string, error) {
	ctx, cancel := c.reqCtx(ctx)
	defer cancel()
	resp, err := c.cli.MemberList(ctx)
	if err != nil {
		return nil, fmt.Errorf("list etcd members: %w", err)
	}
	var urls []string
	for _, m := range resp.Members {
		urls = append(urls, m.ClientURLs...)
	}
	slices.Sort(urls)
	return slices.Compact(urls), nil
}
