package gate

import (
	"context"
	"fmt"

	"github.com/mcpsync/mcpsync/internal/harness/localstack"
)

// RunSection runs one section of the gate by name on a running stack, with opts' defaults
// filled in where zero.
func RunSection(ctx context.Context, name string, st *localstack.Stack, opts Options) ([]Row, error) {
	opts.defaults()
	for _, s := range sections {
		if s.name == name {
			return s.run(ctx, &run{opts: opts, stack: st})
		}
	}
	return nil, fmt.Errorf("no section %q", name)
}
