// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package loadgen

import (
	"syscall"
	"time"
)

// processCPU returns the CPU time (user + system) this process has used, to
// show that the generator is not the bottleneck.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
