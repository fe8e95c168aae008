package config_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/mcpsync/mcpsync/internal/config"
)

// However an Env is printed, the password of DATABASE_URL is masked (issue 14 item 3).
func TestDatabaseURLPasswordMaskedInConfig(t *testing.T) {
	for _, dsn := range []string{
		"postgres://mcpsync:hunter2@db:5432/ledger?sslmode=disable",
		"host=db user=mcpsync password=hunter2 dbname=ledger",
		"host=db password='hunter2' dbname=ledger",
	} {
		t.Setenv("DATABASE_URL", dsn)
		env := config.FromEnv()
		if env.DatabaseURL != dsn {
			t.Fatalf("FromEnv lost DATABASE_URL: %q", env.DatabaseURL)
		}
		for _, out := range []string{
			fmt.Sprint(env), fmt.Sprintf("%v", env), fmt.Sprintf("%+v", env), fmt.Sprintf("%#v", env),
			fmt.Sprintf("%s", env), //lint:ignore S1025 every formatting verb is exercised on purpose
			env.RedactedDatabaseURL(), fmt.Errorf("start: %v", env).Error(),
		} {
			if strings.Contains(out, "hunter2") {
				t.Errorf("%q printed as %q", dsn, out)
			}
			if !strings.Contains(out, "***") {
				t.Errorf("%q printed without a mask: %q", dsn, out)
			}
		}
	}
}
