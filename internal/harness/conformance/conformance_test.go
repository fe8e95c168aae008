// Package conformance runs the official MCP conformance suite's client auth scenarios
// (scripts/conformance.sh, `make conformance`) as part of `go test ./...`, so that `make test`
// and CI report them in the go test summary (issue 14 item 9).
package conformance_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// Every auth/* client scenario of @modelcontextprotocol/conformance passes against mcpsync's
// `source check` / `source login`, except the three scripts/conformance.sh lists with the
// reason they cannot (and which must still fail, so the list stays honest).
func TestConformanceClientAuth(t *testing.T) {
	root, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	suite := filepath.Join(root, "testdata", "conformance", "node_modules", "@modelcontextprotocol", "conformance", "dist", "index.js")
	if _, err := os.Stat(suite); err != nil {
		t.Fatalf("the conformance suite is not installed (%v): run scripts/deps.sh (or make deps), which runs npm ci in testdata/conformance", err)
	}
	for _, tool := range []string{"jq", "curl", "bash"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s is not installed (%v): run scripts/deps.sh", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "scripts", "conformance.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CONFORMANCE_LOGS="+t.TempDir())
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	t.Logf("scripts/conformance.sh:\n%s", out)
	if err != nil {
		t.Fatalf("conformance suite failed: %v", err)
	}
}
