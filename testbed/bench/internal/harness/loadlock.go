// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// machineLock is the file the load tests of every package lock.
var machineLock = filepath.Join(os.TempDir(), "throttle-load-tests.lock")

// TakeMachine holds the machine for the load test until it ends. go test
// runs packages side by side, and a load test measures what its
// collector's CPU quota lets through: two at once on a 2-core machine take
// each other's cores and each measures the other. The lock is a file lock,
// so it also keeps apart two go test runs, and the kernel releases it if a
// test binary dies.
func TakeMachine(tb testing.TB) {
	tb.Helper()
	lockFile(tb, machineLock)
}

// lockFile takes an exclusive lock on path, waiting for it, and releases it
// when tb ends.
func lockFile(tb testing.TB, path string) {
	tb.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		tb.Fatalf("the load tests' lock: %v", err)
	}
	start := time.Now()
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		tb.Fatalf("the load tests' lock %s: %v", path, err)
	}
	if waited := time.Since(start); waited >= time.Second {
		tb.Logf("waited %s for another load test to end (%s)", waited.Round(time.Second), path)
	}
	tb.Cleanup(func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	})
}
