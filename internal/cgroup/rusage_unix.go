// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build unix

package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

import (
	"fmt"
	"syscall"
	"time"
)

func rusageCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("cgroup: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
