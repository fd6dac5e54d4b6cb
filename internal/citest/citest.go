// Package citest holds the one rule for a test whose prerequisite is
// missing (a tool, root, a harness): under CI=true it fails, since .ci/run
// provides every prerequisite and a missing one must not pass silently;
// elsewhere it skips, saying what is missing.
package citest

import (
	"fmt"
	"os"
	"testing"
)

// Unavailable fails t under CI=true and skips it otherwise, with the
// reason.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s (CI=true: .ci/run provides this, so its absence fails the test)", why)
	}
	t.Skip(why)
}

// NeedRoot is Unavailable unless the test runs as root.
func NeedRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root: %s", why)
	}
}
