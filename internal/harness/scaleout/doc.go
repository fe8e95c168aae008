// Package scaleout holds the multi-process lease test of issue 12, defect 6: several real
// session-host processes (the test binary re-executed) share one ledger and one
// fault-injecting MCP server that serves each source on a listener of its own; the test
// checks that the sources spread fairly across the hosts, that the sources of a host killed
// with SIGKILL move to the others within the lease and a few seconds, and that the server
// never sees two live sessions of one source. It has no API: everything is in its tests.
package scaleout
