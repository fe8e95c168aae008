// Package searchattr registers mcpsync's search attributes on a Temporal namespace, so that
// subscriptions can be started with them and found by them in the Temporal UI.
package searchattr

import (
	"context"
	"errors"
	"fmt"

	"go.temporal.io/api/enums/v1"
	"go.temporal.io/api/operatorservice/v1"
	"go.temporal.io/api/serviceerror"
	"go.temporal.io/sdk/client"

	"github.com/mcpsync/mcpsync/internal/contract"
)

// Ensure registers the project's Keyword search attributes on namespace if
// they are missing. Registering an existing attribute is not an error.
func Ensure(ctx context.Context, c client.Client, namespace string) error {
	op := c.OperatorService()
	resp, err := op.ListSearchAttributes(ctx, &operatorservice.ListSearchAttributesRequest{Namespace: namespace})
	if err != nil {
		return fmt.Errorf("list search attributes of namespace %q: %w", namespace, err)
	}
	missing := map[string]enums.IndexedValueType{}
	for _, name := range contract.SearchAttributeNames {
		if _, ok := resp.GetCustomAttributes()[name]; !ok {
			missing[name] = enums.INDEXED_VALUE_TYPE_KEYWORD
		}
	}
	if len(missing) == 0 {
		return nil
	}
	_, err = op.AddSearchAttributes(ctx, &operatorservice.AddSearchAttributesRequest{Namespace: namespace, SearchAttributes: missing})
	var exists *serviceerror.AlreadyExists
	if err != nil && !errors.As(err, &exists) {
		return fmt.Errorf("register search attributes on namespace %q: %w", namespace, err)
	}
	return nil
}
