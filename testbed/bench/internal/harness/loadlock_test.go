// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestLockFileExcludesUntilTheTestEnds: while a test holds the lock,
// another holder (another package's test binary: a lock on its own open
// file) cannot take it; once that test ends, it can.
func TestLockFileExcludesUntilTheTestEnds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lock")
	tryLock := func() bool {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			return false
		}
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		return true
	}
	t.Run("holder", func(t *testing.T) {
		lockFile(t, path)
		if tryLock() {
			t.Error("another holder took the lock while a test held it")
		}
	})
	if !tryLock() {
		t.Error("the lock was not released when the test that held it ended")
	}
}
