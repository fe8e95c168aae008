package shuffle

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// WriteOutcomes prints how often each operation got each outcome, sorted by name.
func (r Report) WriteOutcomes(w io.Writer) error {
	keys := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%-40s %d\n", k, r.Outcomes[k])
	}
	_, err := io.WriteString(w, b.String())
	return err
}
