package cli

import (
	"sort"
	"time"
)

// Commands returns the names of the registered commands ("source add" for a group's), sorted.
func Commands() []string {
	names := make([]string, 0, len(commands))
	for _, c := range commands {
		names = append(names, c.name)
	}
	sort.Strings(names)
	return names
}

// ExitCodeRow is one row of the exit-code table.
type ExitCodeRow = exitCodeRow

// ExitCodeTable returns the exit-code table `mcpsync help` prints.
func ExitCodeTable() []ExitCodeRow { return append([]ExitCodeRow(nil), exitCodes...) }

// Visible is the escaping every human-readable output applies to server-supplied strings.
var Visible = visible

// WriteCatalogEntries writes the entry table of `mcpsync catalog`.
var WriteCatalogEntries = writeCatalogEntries

// SetWatchPoll sets how long watch waits between reads when nothing wakes it, until the
// returned restore is called.
func SetWatchPoll(d time.Duration) (restore func()) {
	old := watchPoll
	watchPoll = d
	return func() { watchPoll = old }
}
