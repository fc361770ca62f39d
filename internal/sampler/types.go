// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package sampler reads the collector's resource usage at a fixed interval,
// turns it into a WaterLevel and publishes it atomically.
package sampler // import "github.com/otelthrottle/throttle/internal/sampler"

import (
	"time"

	"github.com/otelthrottle/throttle/internal/cgroup"
)

// WaterLevel is one published sample. It is immutable once published: readers
// load a *WaterLevel and never write through it.
type WaterLevel struct {
	// CPU is the raw CPU usage of the last window as a share of the
	// effective cores (it can exceed 1 for one window).
	CPU float64
	// CPUFast and CPUSlow are the fast and slow EWMAs of CPU.
	CPUFast float64
	CPUSlow float64
	// CPUValid is false until the first valid CPU window.
	CPUValid bool
	// CPUCarried is true when this frame measured no new CPU window (it was
	// skipped: short window, slow read, counter reset) and the CPU fields
	// repeat the last valid one.
	CPUCarried bool
	// Mem is the memory level: the working set, less the heap memory the Go
	// runtime has freed and keeps for reuse beyond what the heap grows into
	// before its next collection (HeapSpare), plus the heap a soft
	// memory limit holds back (HeapHeldBack), over the memory limit.
	Mem float64
	// MemValid is false when there is no memory limit or memory could not be
	// read; an invalid level counts as safe.
	MemValid bool
	// WorkingSet and MemLimit are the bytes behind Mem (MemLimit 0 = none).
	WorkingSet uint64
	MemLimit   uint64
	// HeapSpare is heap memory the Go runtime has freed and not returned to
	// the kernel, less what the heap grows into before its next collection,
	// at most the working set;
	// HeapHeldBack how many bytes a soft memory limit holds the
	// heap below its normal GC pace (0 without one).
	HeapSpare, HeapHeldBack uint64
	// Cores is the effective number of cores CPU is normalised by.
	Cores float64
	// At is when the sample was taken (monotonic clock reading).
	At time.Time

	// Levels are the levels of the resources the lines are held to, in the
	// order of Config.Readers: each is its reader's reading of this check.
	Levels [MaxResources]Level
}

// MaxResources bounds the resources one sampler reads: Levels is an array,
// so that a check allocates nothing but the WaterLevel it publishes.
const MaxResources = 4

// Level is one resource's level in one check: what its lines are held to.
type Level struct {
	// Valid is false when the resource could not be read (or, for memory,
	// has no limit); an invalid level counts as safe.
	Valid bool
	// Carried: the check measured nothing new (a skipped CPU window), the
	// reading repeats the last one and is no new frame of a breach.
	Carried bool
	// Value is the level as measured in this check; Slow is what the enter
	// and exit lines are compared with, Fast what the hard line is: all
	// three the same for a level that is not averaged.
	Value, Slow, Fast float64
}

// A Reader reads one resource's level at each check, on the sampler's
// goroutine, once CPU, memory and the limits of the check are in wl.
type Reader func(wl *WaterLevel) Level

// ReadCPU is the CPU level: this window's share of the effective cores,
// and its slow and fast averages.
func ReadCPU(wl *WaterLevel) Level {
	return Level{Valid: wl.CPUValid, Carried: wl.CPUCarried, Value: wl.CPU, Slow: wl.CPUSlow, Fast: wl.CPUFast}
}

// ReadMemory is the memory level, not averaged: it is a level, not a rate,
// and averaging would delay the hard line that stands before the OOM
// killer.
func ReadMemory(wl *WaterLevel) Level {
	return Level{Valid: wl.MemValid, Value: wl.Mem, Slow: wl.Mem, Fast: wl.Mem}
}

// Source is where the sampler reads resource usage: the cgroup reader, the
// process fallback, or a test double. Every method may be slow (it reads
// files); the sampler calls them from its own goroutine only.
type Source interface {
	// CPUTime returns the cumulative CPU time used (monotonic counter).
	CPUTime() (time.Duration, error)
	// WorkingSet returns the memory working set in bytes
	// (usage minus inactive file cache, never negative).
	WorkingSet() (uint64, error)
	// Limits re-resolves where the source reads from (a process moved to
	// another cgroup is followed) and returns the binding limits. With an
	// error it still returns the limits to use, the best it knows (what
	// could be read, and earlier values for what could not): the sampler
	// applies them and reports the error.
	Limits() (cgroup.Limits, error)
	// Describe names the source for the startup log, e.g.
	// "cgroup v2 /sys/fs/cgroup/kubepods/pod1" or "process (/proc/self/stat)".
	Describe() string
}
