package mcphost

import (
	"context"
	"fmt"
	"net/http"

	"github.com/modelcontextprotocol/go-sdk/auth"

	"github.com/mcpsync/mcpsync/internal/ledger"
)

// oauthHandler returns the OAuth handler of a source configured with OAuth, nil otherwise.
func oauthHandler(_ context.Context, src ledger.Source, _ *http.Client) (auth.OAuthHandler, error) {
	if src.Connection.OAuth == nil {
		return nil, nil
	}
	return nil, fmt.Errorf("source %q: OAuth is not available in this build", src.Name)
}
