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
// the cpu and memory controllers.
func RequireCgroups(t testing.TB) {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skipf("needs Linux cgroups (GOOS=%s)", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root to create a cgroup (run as root, e.g. in a privileged CI container)")
	}
	probe := fmt.Sprintf("throttle-probe-%d", os.Getpid())
	cg, err := CreateCgroup(probe, 1, 64<<20)
	if err != nil {
		t.Skipf("cannot create a limited cgroup here: %v", err)
	}
	if err := cg.Destroy(); err != nil {
		t.Logf("removing probe cgroup %s: %v", probe, err)
	}
}
