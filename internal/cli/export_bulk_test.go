package cli

import "io"

// SetStdin makes `--uris-file -` read r until the returned restore is called.
func SetStdin(r io.Reader) (restore func()) {
	old := stdin
	stdin = r
	return func() { stdin = old }
}
