package mcphost

import "fmt"

// AuthError is how a session's failure to authenticate reaches the caller: the server
// answered 401 or 403. Challenge is the server's WWW-Authenticate header (its error and
// error_description), never a credential. Callers branch on it with errors.As.
type AuthError struct {
	Status    int
	Challenge string
}

// Error implements error.
func (e *AuthError) Error() string {
	if e.Challenge == "" {
		return fmt.Sprintf("authentication failed: HTTP %d", e.Status)
	}
	return fmt.Sprintf("authentication failed: HTTP %d: %s", e.Status, e.Challenge)
}
