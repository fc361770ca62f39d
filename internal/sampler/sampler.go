// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package sampler // import "github.com/otelthrottle/throttle/internal/sampler"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/cgroup"
)

// DefaultLimitsEvery is how often limits and cores are re-read: a
// container's limits change rarely (an in-place resize, a move to another
// cgroup), and reading them costs several files.
const DefaultLimitsEvery = 10 * time.Second

// Errors reported through Options.OnError for a CPU window that is skipped.
// They are wrapped with the values that caused them; match with errors.Is.
var (
	// ErrCPUCounterBackwards means the cumulative CPU time went down between
	// two ticks (counter reset, or the process moved to another cgroup).
	ErrCPUCounterBackwards = errors.New("CPU time counter went backwards")
	// ErrShortWindow means the time since the last valid reading is shorter
	// than half the interval: a late timer under CFS throttling followed by
	// an early one gives readings far above 1 that are not real.
	ErrShortWindow = errors.New("sample window shorter than half the interval")
	// ErrSlowRead means reading the CPU counter took more than a quarter of
	// the interval: the instant the counter stands for is then uncertain by
	// that much, and the window computed from it would be off by as much.
	ErrSlowRead = errors.New("CPU time read slower than a quarter of the interval")
	// ErrImpossibleCPU means a window used more CPU time than every CPU the
	// process can run on could have given it (with a margin of 2x): the
	// baseline was a bad reading, for example a partial line that cut a
	// number short and looked like a counter reset. Folding it into the
	// EWMAs would hold the fast one above hard for seconds.
	ErrImpossibleCPU = errors.New("CPU window above what the CPUs could use")
)

// cpuCeilingMargin is the slack over the machine's CPUs before a window is
// called impossible: counter granularity and timer jitter, never 2x.
const cpuCeilingMargin = 2

// ReadError is what Options.OnError receives when a read of the Source
// failed. Skipped CPU windows are reported with ErrCPUCounterBackwards,
// ErrShortWindow, ErrSlowRead or ErrImpossibleCPU instead.
type ReadError struct {
	// Resource is "cpu", "memory" or "limits".
	Resource string
	Err      error
}

func (e *ReadError) Error() string { return e.Err.Error() }

// Unwrap returns the underlying error.
func (e *ReadError) Unwrap() error { return e.Err }

// Options are the sampler's collaborators. Every field is optional.
type Options struct {
	// Now is the clock; time.Now (which carries a monotonic reading) when nil.
	Now func() time.Time
	// OnSample is called after each publish, on the goroutine that ran the
	// tick, with the time the tick took. It must not call Stop.
	OnSample func(wl *WaterLevel, took time.Duration)
	// OnError is called for read failures and skipped CPU windows. It is
	// called on every occurrence: the caller rate-limits its logs.
	OnError func(err error)
	// Heap corrects the working set with the Go runtime's view of its
	// heap (softlimit.HeapView); nil: the working set as it is.
	Heap HeapView
	// Logger warns when memory::limit_mib is above the source's limit;
	// nil: no log.
	Logger *zap.Logger
}

// HeapView is the Go runtime's view of its heap: memory freed and not yet
// returned to the kernel beyond what the heap grows into before its next
// collection, and how far a soft memory limit holds the heap below the GC's
// normal pace (see softlimit.HeapView.Read).
type HeapView interface {
	Read() (spare, heldBack uint64)
}

// Sampler turns a Source's counters into WaterLevels at a fixed interval.
type Sampler struct {
	src      Source
	cfg      Config
	now      func() time.Time
	onSample func(*WaterLevel, time.Duration)
	onError  func(error)
	heap     HeapView
	logger   *zap.Logger

	// fastBeta and slowBeta are the EWMAs' weights of history, from their
	// time constants at the interval.
	fastBeta, slowBeta float64

	level atomic.Pointer[WaterLevel]

	// tickMu serialises ticks so that Tick may be called by tests while the
	// goroutine runs, and so that OnSample sees levels in publication order.
	tickMu sync.Mutex
	tick   tickState

	runMu sync.Mutex
	done  chan struct{} // nil when not running
	wg    sync.WaitGroup
}

// tickState is what one tick carries to the next; guarded by tickMu.
type tickState struct {
	// The CPU baseline: the last counter value and when it was read.
	havePrev bool
	prevCPU  time.Duration
	prevAt   time.Time

	// The last valid CPU window and its EWMAs; carried over skipped frames.
	seeded bool
	// cpuFresh: this tick measured a new CPU window (else CPU is carried
	// over from the last one).
	cpuFresh bool
	cpu      float64
	cpuFast  float64
	cpuSlow  float64

	// Limits and cores, re-read every LimitsEvery.
	limitsRead   bool
	limitsReadAt time.Time
	limits       cgroup.Limits
	cores        float64
	// overLimit is the source's memory limit memory::limit_mib was last
	// found above (0: not above), so that the warning is logged once per
	// limit.
	overLimit uint64
}

// New returns a sampler reading src. It does not start it.
func New(src Source, cfg Config, opts Options) *Sampler {
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if cfg.CPU.FastWindow <= 0 {
		cfg.CPU.FastWindow = defaultCPUFastWindow
	}
	if cfg.CPU.SlowWindow <= 0 {
		cfg.CPU.SlowWindow = defaultCPUSlowWindow
	}
	if cfg.LimitsEvery <= 0 {
		cfg.LimitsEvery = DefaultLimitsEvery
	}
	s := &Sampler{
		src:      src,
		cfg:      cfg,
		now:      opts.Now,
		onSample: opts.OnSample,
		onError:  opts.OnError,
		heap:     opts.Heap,
		logger:   opts.Logger,
		fastBeta: EWMABeta(cfg.Interval, cfg.CPU.FastWindow),
		slowBeta: EWMABeta(cfg.Interval, cfg.CPU.SlowWindow),
	}
	if s.logger == nil {
		s.logger = zap.NewNop()
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.onSample == nil {
		s.onSample = func(*WaterLevel, time.Duration) {}
	}
	if s.onError == nil {
		s.onError = func(error) {}
	}
	s.level.Store(&WaterLevel{})
	return s
}

// Load returns the latest published level. It is never nil; before the first
// tick it is the zero level, with both signals invalid.
func (s *Sampler) Load() *WaterLevel {
	return s.level.Load()
}

// Start takes one sample, then starts the goroutine that ticks every
// interval. Calling Start on a running sampler does nothing. When ctx ends
// before the first sample is taken (a read that hangs), Start returns its
// error and starts nothing; the first sample completes in the background
// whenever the read returns.
func (s *Sampler) Start(ctx context.Context) error {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	if s.done != nil {
		return nil
	}
	// The first sample is taken before Start returns so that memory, which
	// needs no baseline, is published by then.
	first := make(chan struct{})
	go func() {
		defer close(first)
		s.Tick()
	}()
	select {
	case <-first:
	case <-ctx.Done():
		return fmt.Errorf("the first sample did not complete: %w", ctx.Err())
	}
	done := make(chan struct{})
	s.done = done
	ticker := time.NewTicker(s.cfg.Interval)
	s.wg.Go(func() {
		defer ticker.Stop()
		for {
			select {
			case <-ticker.C:
			case <-done:
				return
			}
			// Stop wins over a tick that is due at the same time.
			select {
			case <-done:
				return
			default:
			}
			s.Tick()
		}
	})
	return nil
}

// Stop stops the goroutine and waits for it to return. It is idempotent and
// safe to call without Start; the sampler can be started again afterwards.
func (s *Sampler) Stop() {
	s.runMu.Lock()
	defer s.runMu.Unlock()
	if s.done == nil {
		return
	}
	close(s.done)
	s.wg.Wait()
	s.done = nil
}

// Tick takes one sample, publishes it and calls OnSample. The goroutine
// started by Start calls it every interval; it is exported for tests and
// benchmarks, which drive it with a fake clock and Source.
//
// A skipped CPU window (counter backwards, short window, slow read,
// impossible value) keeps the last CPU values and their validity: the frame
// still publishes a fresh memory level, which is the one that cannot wait.
func (s *Sampler) Tick() {
	s.tickMu.Lock()
	defer s.tickMu.Unlock()
	t := &s.tick

	// Read the clock and the counter back to back so that the window
	// measured on both is the same; limits are read after, they may be slow.
	at := s.now()
	cpuTime, cpuErr := s.src.CPUTime()
	read := s.now().Sub(at)

	// Before also re-reads after a clock that went backwards (only an
	// injected clock without a monotonic reading can).
	if !t.limitsRead || at.Sub(t.limitsReadAt) >= s.cfg.LimitsEvery || at.Before(t.limitsReadAt) {
		s.readLimits(at)
	}

	cpuValid := false
	t.cpuFresh = false
	switch {
	case cpuErr != nil:
		s.onError(&ReadError{Resource: "cpu", Err: fmt.Errorf("reading CPU time: %w", cpuErr)})
	case read > s.cfg.Interval/4:
		// Drop the baseline rather than move it: this reading's instant is
		// as uncertain as the read was long. The next tick takes a new
		// baseline and the one after measures a clean window again.
		s.onError(fmt.Errorf("%w: took %v at an interval of %v; frame skipped", ErrSlowRead, read, s.cfg.Interval))
		t.havePrev = false
		cpuValid = t.seeded
	default:
		cpuValid = s.observeCPU(at, cpuTime)
	}

	wl := &WaterLevel{
		CPU:      t.cpu,
		CPUFast:  t.cpuFast,
		CPUSlow:  t.cpuSlow,
		CPUValid: cpuValid,
		// A skipped frame repeats the last window: the state machine must
		// not count it as one more consecutive frame at that level.
		CPUCarried: cpuValid && !t.cpuFresh,
		Cores:      t.cores,
		At:         at,
	}
	wl.MemLimit = t.limits.MemLimit
	if o := s.cfg.Memory.limit(); o > 0 && (wl.MemLimit == 0 || o < wl.MemLimit) {
		wl.MemLimit = o
	}
	// Memory is read every tick and not smoothed: it is a level, not a rate,
	// and smoothing would delay the hard line that stands before the OOM kill.
	if ws, err := s.src.WorkingSet(); err != nil {
		s.onError(&ReadError{Resource: "memory", Err: fmt.Errorf("reading memory working set: %w", err)})
	} else {
		wl.WorkingSet = ws
		// Memory the heap has freed beyond what it grows into before its
		// next collection is reused before the kernel is asked for more,
		// so it is no step towards the OOM killer; what a soft
		// memory limit holds back is memory the collector would use at its
		// normal GC pace, so counting it keeps the memory lines meaning the
		// same with and without a soft limit, and makes the throttle shed
		// while the extra collections are still cheap.
		if s.heap != nil {
			spare, heldBack := s.heap.Read()
			// The working set is the cgroup's, read at another instant.
			wl.HeapSpare, wl.HeapHeldBack = min(spare, ws), heldBack
		}
		if wl.MemLimit > 0 {
			wl.Mem = float64(ws-wl.HeapSpare+wl.HeapHeldBack) / float64(wl.MemLimit)
			wl.MemValid = true
		}
	}

	for i, read := range s.cfg.Readers[:min(len(s.cfg.Readers), MaxResources)] {
		wl.Levels[i] = read(wl)
	}

	s.level.Store(wl)
	s.onSample(wl, s.now().Sub(at))
}

// readLimits re-reads the limits and recomputes the cores. The limits are
// taken even with an error: the Source returns the best it knows then (see
// Source.Limits), and keeping the previous ones instead would keep none at
// all for as long as one level of the hierarchy fails from the start. The
// next attempt is one LimitsEvery later, so a broken file is not re-read (and
// reported) on every tick.
func (s *Sampler) readLimits(at time.Time) {
	t := &s.tick
	t.limitsRead = true
	t.limitsReadAt = at
	l, err := s.src.Limits()
	if err != nil {
		s.onError(&ReadError{Resource: "limits", Err: fmt.Errorf("reading limits: %w", err)})
	}
	t.limits = l
	t.cores = EffectiveCores(t.limits, s.cfg.CPU.FallbackCores)
	if o := s.cfg.Memory.limit(); o > 0 && l.MemLimit > 0 && o > l.MemLimit {
		if t.overLimit != l.MemLimit {
			t.overLimit = l.MemLimit
			s.logger.Warn("throttle: memory::limit_mib is above the container's memory limit; the container's limit is used",
				zap.Uint64("memory_limit_mib", o>>20), zap.Uint64("container_memory_limit_bytes", l.MemLimit))
		}
	} else {
		t.overLimit = 0
	}
}

// observeCPU turns a counter reading into a CPU window, folds it into the
// EWMAs and reports whether the CPU level is valid in this frame.
func (s *Sampler) observeCPU(at time.Time, cpuTime time.Duration) bool {
	t := &s.tick
	if !t.havePrev {
		t.havePrev, t.prevCPU, t.prevAt = true, cpuTime, at
		return t.seeded
	}
	if cpuTime < t.prevCPU {
		// The old baseline means nothing any more: restart from this one.
		s.onError(fmt.Errorf("%w: from %v to %v; frame skipped", ErrCPUCounterBackwards, t.prevCPU, cpuTime))
		t.prevCPU, t.prevAt = cpuTime, at
		return t.seeded
	}
	wall := at.Sub(t.prevAt)
	if wall < 0 {
		// Impossible on the default clock, whose readings carry a monotonic
		// reading that Sub uses; an injected wall clock may jump back.
		// Keeping the baseline would skip every frame until the clock caught
		// up again, so restart from this one.
		s.onError(fmt.Errorf("%w: clock went back by %v; baseline reset, frame skipped", ErrShortWindow, -wall))
		t.prevCPU, t.prevAt = cpuTime, at
		return t.seeded
	}
	if wall < s.cfg.Interval/2 {
		// Keep the baseline: the next window spans this one, so no CPU time
		// is lost, only the too-short division.
		s.onError(fmt.Errorf("%w: %v < %v/2; frame skipped", ErrShortWindow, wall, s.cfg.Interval))
		return t.seeded
	}
	cpu := float64(cpuTime-t.prevCPU) / (float64(wall) * t.cores)
	t.prevCPU, t.prevAt = cpuTime, at
	if ceiling := cpuCeilingMargin * float64(max(runtime.NumCPU(), t.limits.CPUSetCores)) / t.cores; cpu > ceiling {
		// The new baseline is this reading: of the two, the previous one is
		// the more likely to be wrong (it went "backwards" or was cut short).
		s.onError(fmt.Errorf("%w: %.3g > %.3g of %.3g cores; frame skipped", ErrImpossibleCPU, cpu, ceiling, t.cores))
		return t.seeded
	}

	// cpu above 1 is real for one window (CFS quota spent in a burst): keep it.
	t.cpu = cpu
	t.cpuFresh = true
	if !t.seeded {
		t.seeded = true
		t.cpuFast, t.cpuSlow = cpu, cpu
	} else {
		t.cpuFast = ewma(t.cpuFast, cpu, s.fastBeta)
		t.cpuSlow = ewma(t.cpuSlow, cpu, s.slowBeta)
	}
	return true
}

// ewma is one step of s_t = (1-β)·x_t + β·s_{t-1}; β is the weight of history.
func ewma(prev, x, beta float64) float64 {
	return (1-beta)*x + beta*prev
}

// EWMABeta is the weight of history of an EWMA updated every interval with
// the time constant window: exp(-interval/window), so that the average
// means the same time whatever the interval (at 250ms, 5s gives 0.951 and
// 700ms 0.700).
func EWMABeta(interval, window time.Duration) float64 {
	return math.Exp(-float64(interval) / float64(window))
}

// EffectiveCores returns the number of cores CPU time is normalised by:
// min(cpuset, quota) when a quota exists, kept fractional; otherwise
// fallback, or runtime.GOMAXPROCS(0) when fallback is not positive. The
// host's core count is never used when a quota exists: with a 1-core quota
// on a 14-core host it would under-read CPU 14 times.
func EffectiveCores(l cgroup.Limits, fallback float64) float64 {
	if l.QuotaCores > 0 && !math.IsInf(l.QuotaCores, 0) {
		if l.CPUSetCores > 0 && float64(l.CPUSetCores) < l.QuotaCores {
			return float64(l.CPUSetCores)
		}
		return l.QuotaCores
	}
	if fallback > 0 && !math.IsInf(fallback, 0) {
		return fallback
	}
	return float64(runtime.GOMAXPROCS(0))
}
