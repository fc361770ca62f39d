// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"fmt"
	"os"
	"runtime"
	"testing"

	"github.com/otelthrottle/throttle/internal/testutil/e2eskip"
)

// RequireCgroups skips the test, saying why, where this harness cannot
// create a limited cgroup: not Linux, not root, or no writable cgroup with
// the cpu and memory controllers. Under CI, which runs the end-to-end tests
// as root, it fails the test instead.
func RequireCgroups(tb testing.TB) {
	tb.Helper()
	if runtime.GOOS != "linux" {
		e2eskip.Missing(tb, "a load test in a limited cgroup needs Linux cgroups (GOOS=%s)", runtime.GOOS)
	}
	if os.Geteuid() != 0 {
		e2eskip.Missing(tb, "a load test in a limited cgroup needs root to create it: run make e2e as root (e.g. in a privileged container)")
	}
	probe := fmt.Sprintf("throttle-probe-%d", os.Getpid())
	cg, err := CreateCgroup(probe, 1, 64<<20)
	if err != nil {
		e2eskip.Missing(tb, "a load test in a limited cgroup, and none can be created here: %v", err)
	}
	if err := cg.Destroy(); err != nil {
		tb.Logf("removing probe cgroup %s: %v", probe, err)
	}
}
