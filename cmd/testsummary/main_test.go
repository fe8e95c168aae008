package main

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// A stream is go test -json events, one per line, written as pkg|test|action|output.
func stream(lines ...string) string {
	var b strings.Builder
	for _, l := range lines {
		f := strings.SplitN(l, "|", 4)
		b.WriteString(`{"Action":"` + f[2] + `","Package":"` + f[0] + `"`)
		if f[1] != "" {
			b.WriteString(`,"Test":"` + f[1] + `"`)
		}
		if len(f) == 4 {
			b.WriteString(`,"Output":"` + f[3] + `\n"`)
		}
		b.WriteString("}\n")
	}
	return b.String()
}

func TestSummarize(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		wantCode int
		want     []string // lines the report must contain
		dontWant []string
	}{
		{
			name:     "all pass",
			in:       stream("p|TestA|run", "p|TestA|output|hello", "p|TestA|pass", "p||pass"),
			want:     []string{"ok   p", "packages: 1 ok, 0 failed", "tests:    1 passed, 0 failed, 0 skipped"},
			dontWant: []string{"hello", "without a result"},
		},
		{
			name:     "failed test shows its output",
			in:       stream("p|TestA|run", "p|TestA|output|boom at line 3", "p|TestA|fail", "p||fail"),
			wantCode: 1,
			want:     []string{"FAIL p", "tests:    0 passed, 1 failed", "--- FAIL p TestA", "boom at line 3"},
		},
		{
			// The binary exits inside TestB: go test reports the package failed and no result
			// for TestB; the cause is in TestB's output.
			name: "binary ended mid-test",
			in: stream("p|TestA|run", "p|TestA|pass", "p|TestB|run", "p|TestB|output|fatal: server lost its lock",
				"p||output|FAIL\tp\t1.0s", "p||fail", "q|TestC|run", "q|TestC|pass", "q||pass"),
			wantCode: 1,
			want: []string{"FAIL p", "--- NO RESULT TestB", "fatal: server lost its lock",
				"tests:    2 passed, 0 failed, 0 skipped", "1 without a result"},
			dontWant: []string{"TestC (the test"},
		},
		{
			name:     "build failure only",
			in:       "# p\n./x.go:1: syntax error\n",
			wantCode: 1,
			want:     []string{"./x.go:1: syntax error", "packages: 0 ok, 0 failed"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out bytes.Buffer
			code := summarize(strings.NewReader(tt.in), &out, time.Now())
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d", code, tt.wantCode)
			}
			for _, w := range tt.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("report lacks %q:\n%s", w, out.String())
				}
			}
			for _, w := range tt.dontWant {
				if strings.Contains(out.String(), w) {
					t.Errorf("report has %q:\n%s", w, out.String())
				}
			}
		})
	}
}
