package mcphost

import "slices"

// Holders returns the IDs of the subscriptions holding the server-side subscription of
// serverURI on this session, sorted.
func (c *Conn) Holders(serverURI string) []int64 {
	us := c.uriSub(serverURI, false)
	if us == nil {
		return nil
	}
	us.mu.Lock()
	defer us.mu.Unlock()
	out := make([]int64, 0, len(us.holders))
	for id := range us.holders {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}
