// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package testutil // import "github.com/otelthrottle/throttle/internal/testutil"

import (
	"math"
	"sync"
	"testing"
	"time"

	"github.com/otelthrottle/throttle/internal/cgroup"
)

// Reading is one of a Source's three readings.
type Reading int

const (
	CPUTime Reading = iota
	WorkingSet
	Limits
	numReadings
)

// SourceDescription is what a Source's Describe returns (the start log's
// resource_source).
const SourceDescription = "fake source (test)"

// Source is a resource source (internal/sampler's Source) whose readings the
// test sets: a CPU time counter, a working set and the limits, any of which
// can be made to fail; it counts its reads. It is safe for concurrent use:
// the sampler reads it on its own goroutine while the test changes it.
// The zero CPU time is constant until set, so the CPU level stays 0 and
// only the memory level moves the state.
type Source struct {
	mu      sync.Mutex
	cpu     time.Duration
	cpuStep time.Duration
	ws      uint64
	limits  cgroup.Limits
	faults  [numReadings]fault
	reads   [numReadings]int

	// gate, when set, is what CPUTime reads wait for (BlockCPUTime);
	// blocked gets one send when a read starts waiting.
	gate       chan struct{}
	blocked    chan struct{}
	cpuReading int // CPUTime calls in progress
}

// fault is the error a reading fails with, for the next n reads (n < 0:
// every read).
type fault struct {
	err error
	n   int
}

// NewSource returns a source with these limits, a working set of 0 and a
// CPU time of 0.
func NewSource(limits cgroup.Limits) *Source {
	return &Source{limits: limits, blocked: make(chan struct{}, 1)}
}

// SetCPUTime sets the CPU time counter.
func (s *Source) SetCPUTime(d time.Duration) {
	s.mu.Lock()
	s.cpu = d
	s.mu.Unlock()
}

// AddCPUTime advances the CPU time counter by d.
func (s *Source) AddCPUTime(d time.Duration) {
	s.mu.Lock()
	s.cpu += d
	s.mu.Unlock()
}

// SetCPUStep makes every CPUTime read add step to the counter before it
// returns it: a negative step is a counter that keeps going backwards.
func (s *Source) SetCPUStep(step time.Duration) {
	s.mu.Lock()
	s.cpuStep = step
	s.mu.Unlock()
}

// SetWorkingSet sets the working set in bytes.
func (s *Source) SetWorkingSet(bytes uint64) {
	s.mu.Lock()
	s.ws = bytes
	s.mu.Unlock()
}

// SetMemoryShare sets the working set to share of the memory limit
// (rounded to a byte), which is the memory level the sampler then reports.
func (s *Source) SetMemoryShare(share float64) {
	s.mu.Lock()
	s.ws = uint64(math.Round(share * float64(s.limits.MemLimit)))
	s.mu.Unlock()
}

// SetLimits sets the limits (a resized container).
func (s *Source) SetLimits(l cgroup.Limits) {
	s.mu.Lock()
	s.limits = l
	s.mu.Unlock()
}

// Fail makes every read of r fail with err, until Fail(r, nil).
func (s *Source) Fail(r Reading, err error) { s.FailNext(r, -1, err) }

// FailNext makes the next n reads of r fail with err; later reads succeed.
func (s *Source) FailNext(r Reading, n int, err error) {
	s.mu.Lock()
	s.faults[r] = fault{err: err, n: n}
	s.mu.Unlock()
}

// Reads is how many times r was read.
func (s *Source) Reads(r Reading) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads[r]
}

// readLocked counts a read of r and returns the error it fails with, if any.
func (s *Source) readLocked(r Reading) error {
	s.reads[r]++
	f := &s.faults[r]
	if f.err == nil || f.n == 0 {
		return nil
	}
	if f.n > 0 {
		f.n--
	}
	return f.err
}

func (s *Source) CPUTime() (time.Duration, error) {
	s.mu.Lock()
	s.cpuReading++
	defer func() { s.cpuReading--; s.mu.Unlock() }()
	if g := s.gate; g != nil {
		s.mu.Unlock()
		select {
		case s.blocked <- struct{}{}:
		default:
		}
		<-g
		s.mu.Lock()
	}
	if err := s.readLocked(CPUTime); err != nil {
		return 0, err
	}
	s.cpu += s.cpuStep
	return s.cpu, nil
}

func (s *Source) WorkingSet() (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.readLocked(WorkingSet); err != nil {
		return 0, err
	}
	return s.ws, nil
}

// Limits returns the limits set even when it fails, as cgroup.Reader returns
// the best it knows along with its error: a test that wants none readable
// sets none.
func (s *Source) Limits() (cgroup.Limits, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limits, s.readLocked(Limits)
}

func (*Source) Describe() string { return SourceDescription }

// BlockCPUTime makes CPUTime reads wait, as a read stuck in the kernel
// would, and returns once one is waiting (so the sampler is stuck in it);
// release lets them return. It is idempotent and also runs at the test's
// cleanup, before the cleanups registered earlier (a Shutdown that waits for
// the sampler).
func (s *Source) BlockCPUTime(tb testing.TB) (release func()) {
	tb.Helper()
	gate := make(chan struct{})
	s.mu.Lock()
	s.gate = gate
	s.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			s.mu.Lock()
			s.gate = nil
			s.mu.Unlock()
			close(gate)
		})
	}
	tb.Cleanup(release)
	select {
	case <-s.blocked:
	case <-time.After(10 * time.Second):
		tb.Fatal("the sampler never read the CPU time")
	}
	return release
}

// ReadingCPUTime tells whether a CPUTime read is in progress (waiting or
// not).
func (s *Source) ReadingCPUTime() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cpuReading > 0
}
