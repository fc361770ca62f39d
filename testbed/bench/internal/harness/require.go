// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"fmt"
	"os"
	"runtime"
	"testing"
)

// RequireCgroups skips the test, saying why, where this harness cannot
// create a limited cgroup: not Linux, not root, or no writable cgroup with
// the cpu and memory controllers; and with -short (make unit), which runs
// no load test.
func RequireCgroups(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("-short: a load test in a limited cgroup, as root (make test runs it)")
	}
	if runtime.GOOS != "linux" {
		tb.Skipf("needs Linux cgroups (GOOS=%s)", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		tb.Skip("needs root to create a cgroup (run as root, e.g. in a privileged CI container)")
	}
	probe := fmt.Sprintf("throttle-probe-%d", os.Getpid())
	cg, err := CreateCgroup(probe, 1, 64<<20)
	if err != nil {
		tb.Skipf("cannot create a limited cgroup here: %v", err)
	}
	if err := cg.Destroy(); err != nil {
		tb.Logf("removing probe cgroup %s: %v", probe, err)
	}
}
