// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package cgroup reads the CPU and memory usage and limits of the process's
// cgroup (v1 or v2) from the files under a root folder, and falls back to
// the process's own counters where there is no cgroup.
//
// It uses only the standard library.
package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

// Limits are the resource limits that bind the process, read at a slow
// cadence.
type Limits struct {
	// QuotaCores is the smallest CPU quota on the cgroup path, in cores
	// (quota/period, fractional); 0 means no quota anywhere.
	QuotaCores float64
	// CPUSetCores is the number of CPUs in the effective cpuset; 0 = unknown.
	CPUSetCores int
	// MemLimit is the smallest memory limit on the cgroup path in bytes;
	// 0 means no limit anywhere.
	MemLimit uint64
}
