// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package e2eskip lets an end-to-end test (build tag e2e, make e2e) step
// aside where this machine lacks what it needs, a tool or a privilege,
// except in CI, which installs everything and must not pass a test that
// never ran; and keeps a slow component test out of make test. It imports
// nothing of this repository, so that any test package, the cgroup
// package's own included, can use it.
package e2eskip // import "github.com/otelthrottle/throttle/internal/testutil/e2eskip"

import (
	"os"
	"testing"
)

// Missing skips the test, saying what is missing and how to get it; under
// CI (see InCI) it fails the test with the same words instead.
func Missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if InCI() {
		tb.Fatalf("CI is set, so nothing may be skipped: "+format, args...)
	}
	tb.Skipf(format, args...)
}

// Slow skips a component test that takes long for what it waits on, unless
// the build has the e2e tag: make test stays quick, make e2e runs it. why
// says what it waits on.
func Slow(tb testing.TB, why string) {
	tb.Helper()
	if !tagged {
		tb.Skip("slow, run by make e2e (build tag e2e): " + why)
	}
}

// InCI reports whether the environment variable CI is set to something
// other than "false" or "0", as CI services set it (CI=true).
func InCI() bool {
	switch os.Getenv("CI") {
	case "", "false", "0":
		return false
	}
	return true
}
