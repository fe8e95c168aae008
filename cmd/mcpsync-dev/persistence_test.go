package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/devenv/devtemporal"
)

// TestChoosePersistence: the default persistence applies to new data directories; one that
// holds a SQLite Temporal store keeps it unless the persistence was chosen explicitly, and says
// so in one note.
func TestChoosePersistence(t *testing.T) {
	withSQLite := t.TempDir()
	if err := os.WriteFile(filepath.Join(withSQLite, devtemporal.DatabaseFileName), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	const pg, lite = devtemporal.PersistencePostgres, devtemporal.PersistenceSQLite
	tests := []struct {
		name      string
		requested devtemporal.Persistence
		explicit  bool
		dir       string
		want      devtemporal.Persistence
		wantNote  bool
	}{
		{"new data directory takes the default", pg, false, empty, pg, false},
		{"existing SQLite store is kept", pg, false, withSQLite, lite, true},
		{"explicit postgres switches", pg, true, withSQLite, pg, false},
		{"explicit sqlite", lite, true, empty, lite, false},
		{"sqlite requested by default", lite, false, withSQLite, lite, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, note := choosePersistence(tt.requested, tt.explicit, tt.dir)
			if got != tt.want || (note != "") != tt.wantNote {
				t.Fatalf("choosePersistence = %s, %q; want %s, note %v", got, note, tt.want, tt.wantNote)
			}
			if tt.wantNote && !strings.Contains(note, devtemporal.DatabaseFileName) {
				t.Errorf("note %q does not name the store", note)
			}
		})
	}
}
