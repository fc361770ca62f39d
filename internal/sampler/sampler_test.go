// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package sampler

import (
	"context"
	"errors"
	"math"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newSource is a fake source with working set ws and these limits.
func newSource(ws uint64, limits cgroup.Limits) *testutil.Source {
	src := testutil.NewSource(limits)
	src.SetWorkingSet(ws)
	return src
}

// newClock is a manual clock for the sampler's Now.
func newClock() *testutil.Clock { return testutil.NewClock(time.Unix(1_000_000, 0)) }

// harness wires a Sampler to a fake source and clock and records errors.
type harness struct {
	src    *testutil.Source
	clock  *testutil.Clock
	s      *Sampler
	errs   []error
	levels []*WaterLevel
}

const interval = 250 * time.Millisecond

func newHarness(cfg Config, src *testutil.Source) *harness {
	h := &harness{src: src, clock: newClock()}
	if cfg.Interval == 0 {
		cfg.Interval = interval
	}
	h.s = New(src, cfg, Options{
		Now:      h.clock.Now,
		OnError:  func(err error) { h.errs = append(h.errs, err) },
		OnSample: func(wl *WaterLevel, _ time.Duration) { h.levels = append(h.levels, wl) },
	})
	return h
}

// step advances the clock by wall and the CPU counter by cpu, then ticks.
func (h *harness) step(wall, cpu time.Duration) *WaterLevel {
	h.clock.Advance(wall)
	h.src.AddCPUTime(cpu)
	h.s.Tick()
	return h.s.Load()
}

func oneCore() *testutil.Source { return newSource(0, cgroup.Limits{QuotaCores: 1}) }

func TestLoadBeforeFirstTick(t *testing.T) {
	s := New(oneCore(), Config{}, Options{})
	wl := s.Load()
	require.NotNil(t, wl)
	assert.False(t, wl.CPUValid)
	assert.False(t, wl.MemValid)
}

func TestFirstValidWindowSeedsBothEWMAs(t *testing.T) {
	h := newHarness(Config{}, oneCore())

	wl := h.step(0, 0)
	assert.False(t, wl.CPUValid, "the first tick only takes the baseline")
	assert.Equal(t, 1.0, wl.Cores)

	wl = h.step(interval, interval/2)
	require.True(t, wl.CPUValid)
	assert.Equal(t, 0.5, wl.CPU)
	assert.Equal(t, 0.5, wl.CPUFast)
	assert.Equal(t, 0.5, wl.CPUSlow)
	assert.Empty(t, h.errs)
}

func TestEWMAMath(t *testing.T) {
	// Time constants of 1 and 4 intervals: β = e^-1 and e^-1/4.
	h := newHarness(Config{CPU: CPUConfig{FastWindow: interval, SlowWindow: 4 * interval}}, oneCore())
	bf, bs := math.Exp(-1), math.Exp(-0.25)
	h.step(0, 0)
	h.step(interval, interval/2) // seeds at 0.5

	// s_t = (1-β)·x_t + β·s_{t-1}
	fast, slow := 0.5, 0.5
	for i, x := range []float64{1.0, 1.0, 0.25, 0.0, 0.75} {
		wl := h.step(interval, time.Duration(x*float64(interval)))
		fast = (1-bf)*x + bf*fast
		slow = (1-bs)*x + bs*slow
		assert.InDelta(t, x, wl.CPU, 1e-12, "window %d", i)
		assert.InDelta(t, fast, wl.CPUFast, 1e-12, "window %d", i)
		assert.InDelta(t, slow, wl.CPUSlow, 1e-12, "window %d", i)
	}
	// The defaults at 250ms (5s and 700ms: β 0.951 and 0.700), after the
	// first step: fast 0.3·1+0.7·0.5, slow 0.049·1+0.951·0.5.
	h2 := newHarness(Config{}, oneCore())
	h2.step(0, 0)
	h2.step(interval, interval/2)
	wl := h2.step(interval, interval)
	bf, bs = math.Exp(-0.25/0.7), math.Exp(-0.25/5)
	assert.InDelta(t, (1-bf)*1+bf*0.5, wl.CPUFast, 1e-12)
	assert.InDelta(t, (1-bs)*1+bs*0.5, wl.CPUSlow, 1e-12)
	assert.InDelta(t, 0.65, wl.CPUFast, 1e-3)
	assert.InDelta(t, 0.5244, wl.CPUSlow, 1e-4)
}

// TestEWMABeta: a time constant means the same time at any interval.
func TestEWMABeta(t *testing.T) {
	assert.InDelta(t, 0.951, EWMABeta(250*time.Millisecond, 5*time.Second), 1e-3)
	assert.InDelta(t, 0.700, EWMABeta(250*time.Millisecond, 700*time.Millisecond), 1e-3)
	// Ten checks of 100ms weigh an old value as much as four of 250ms.
	assert.InDelta(t, math.Pow(EWMABeta(250*time.Millisecond, 5*time.Second), 4),
		math.Pow(EWMABeta(100*time.Millisecond, 5*time.Second), 10), 1e-12)
	// A window far shorter than the interval: no smoothing, never NaN.
	assert.Zero(t, EWMABeta(10*time.Second, time.Nanosecond))
}

func TestCPUNormalisedByFractionalCores(t *testing.T) {
	h := newHarness(Config{}, newSource(0, cgroup.Limits{QuotaCores: 1.5, CPUSetCores: 4}))
	h.step(0, 0)
	wl := h.step(time.Second, 750*time.Millisecond)
	assert.Equal(t, 1.5, wl.Cores)
	assert.InDelta(t, 0.5, wl.CPU, 1e-12)
}

func TestCPUAboveOneIsKept(t *testing.T) {
	h := newHarness(Config{}, oneCore())
	h.step(0, 0)
	wl := h.step(interval, 600*time.Millisecond)
	require.True(t, wl.CPUValid)
	assert.InDelta(t, 2.4, wl.CPU, 1e-12)
	assert.InDelta(t, 2.4, wl.CPUSlow, 1e-12)
	assert.Empty(t, h.errs)
}

func TestCounterBackwardsSkipsFrame(t *testing.T) {
	h := newHarness(Config{}, oneCore())
	h.src.SetCPUTime(10 * time.Second)
	h.step(0, 0)
	before := h.step(interval, interval/2)

	h.src.SetCPUTime(time.Second)
	wl := h.step(interval, 0)
	require.Len(t, h.errs, 1)
	require.ErrorIs(t, h.errs[0], ErrCPUCounterBackwards)
	// No new CPU value: the last one is carried, still valid.
	assert.Equal(t, before.CPU, wl.CPU)
	assert.Equal(t, before.CPUFast, wl.CPUFast)
	assert.Equal(t, before.CPUSlow, wl.CPUSlow)
	assert.True(t, wl.CPUValid)
	assert.Len(t, h.levels, 3, "the frame still publishes (memory is fresh)")

	// The baseline restarted at the backwards reading.
	wl = h.step(interval, interval)
	assert.InDelta(t, 1.0, wl.CPU, 1e-12)
	assert.Len(t, h.errs, 1)
}

func TestShortWindowSkipsFrame(t *testing.T) {
	h := newHarness(Config{}, oneCore())
	h.step(0, 0)
	before := h.step(interval, interval/2)

	// 100ms < 125ms: a late timer followed by an early one.
	wl := h.step(100*time.Millisecond, 240*time.Millisecond)
	require.Len(t, h.errs, 1)
	require.ErrorIs(t, h.errs[0], ErrShortWindow)
	assert.Equal(t, before.CPU, wl.CPU)
	assert.Equal(t, before.CPUSlow, wl.CPUSlow)
	assert.False(t, before.CPUCarried)
	assert.True(t, wl.CPUValid)
	assert.True(t, wl.CPUCarried, "a skipped frame repeats the last window")

	// The baseline was kept: the next window spans both (400ms, 300ms of CPU).
	wl = h.step(300*time.Millisecond, 60*time.Millisecond)
	assert.InDelta(t, 0.75, wl.CPU, 1e-12)
	assert.False(t, wl.CPUCarried)
	assert.Len(t, h.errs, 1)

	// Exactly half the interval is long enough.
	wl = h.step(interval/2, interval/2)
	assert.InDelta(t, 1.0, wl.CPU, 1e-12)
	assert.Len(t, h.errs, 1)
}

func TestMemory(t *testing.T) {
	// Sizes in MiB, the unit of memory::limit_mib.
	tests := []struct {
		name        string
		srcLimit    uint64
		override    uint64
		ws          uint64
		wantValid   bool
		wantMem     float64
		wantLimitIn uint64
	}{
		{name: "no limit anywhere", ws: 500, wantValid: false},
		{name: "source limit", srcLimit: 1000, ws: 500, wantValid: true, wantMem: 0.5, wantLimitIn: 1000},
		{name: "override under the source limit wins", srcLimit: 2000, override: 1000, ws: 500, wantValid: true, wantMem: 0.5, wantLimitIn: 1000},
		// Above the container's limit the override would keep the memory
		// lines above the OOM killer's.
		{name: "override over the source limit loses", srcLimit: 1000, override: 2000, ws: 500, wantValid: true, wantMem: 0.5, wantLimitIn: 1000},
		{name: "override without source limit", override: 4000, ws: 1000, wantValid: true, wantMem: 0.25, wantLimitIn: 4000},
		{name: "over the limit", srcLimit: 1000, ws: 1500, wantValid: true, wantMem: 1.5, wantLimitIn: 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src := newSource(tt.ws<<20, cgroup.Limits{MemLimit: tt.srcLimit << 20})
			h := newHarness(Config{Memory: MemoryConfig{LimitMiB: tt.override}}, src)
			wl := h.step(0, 0)
			assert.Equal(t, tt.wantValid, wl.MemValid)
			assert.Equal(t, tt.ws<<20, wl.WorkingSet)
			assert.Equal(t, tt.wantLimitIn<<20, wl.MemLimit)
			assert.InDelta(t, tt.wantMem, wl.Mem, 1e-12)
		})
	}
}

// TestMemoryOverrideOverTheLimitWarns: a memory::limit_mib above the
// container's limit is logged once per container limit, naming the field,
// and again when the container's limit changes.
func TestMemoryOverrideOverTheLimitWarns(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	src := newSource(500<<20, cgroup.Limits{MemLimit: 1 << 30})
	clock := newClock()
	s := New(src, Config{Interval: interval, Memory: MemoryConfig{LimitMiB: 2 << 10}, LimitsEvery: time.Second}, Options{Now: clock.Now, Logger: zap.New(core)})
	for range 3 {
		s.Tick()
		clock.Advance(time.Second)
	}
	assert.Equal(t, uint64(1<<30), s.Load().MemLimit)
	warns := logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet("memory::limit_mib").All()
	require.Len(t, warns, 1, "once per container limit")
	assert.Equal(t, uint64(2048), warns[0].ContextMap()["memory_limit_mib"])
	assert.Equal(t, uint64(1<<30), warns[0].ContextMap()["container_memory_limit_bytes"])

	src.SetLimits(cgroup.Limits{MemLimit: 1536 << 20}) // resized, still under the override
	s.Tick()
	assert.Equal(t, uint64(1536<<20), s.Load().MemLimit)
	assert.Equal(t, 2, logs.FilterMessageSnippet("memory::limit_mib").Len())

	src.SetLimits(cgroup.Limits{MemLimit: 4 << 30}) // over the override: the override binds
	clock.Advance(time.Second)
	s.Tick()
	assert.Equal(t, uint64(2<<30), s.Load().MemLimit)
	assert.Equal(t, 2, logs.FilterMessageSnippet("memory::limit_mib").Len())
}

// fakeHeap is a HeapView with fixed figures.
type fakeHeap struct{ spare, heldBack uint64 }

func (h fakeHeap) Read() (spare, heldBack uint64) { return h.spare, h.heldBack }

// TestMemoryHeapCorrections checks the level the lines apply to: the working
// set less the spare heap (never below nothing) plus the held-back heap.
func TestMemoryHeapCorrections(t *testing.T) {
	f := func(ws uint64, heap fakeHeap, wantMem float64, wantSpare uint64) {
		t.Helper()
		src := newSource(ws, cgroup.Limits{MemLimit: 1000})
		s := New(src, Config{Interval: interval}, Options{Heap: heap})
		s.Tick()
		wl := s.Load()
		require.True(t, wl.MemValid)
		assert.InDelta(t, wantMem, wl.Mem, 1e-12)
		assert.Equal(t, ws, wl.WorkingSet)
		assert.Equal(t, wantSpare, wl.HeapSpare)
		assert.Equal(t, heap.heldBack, wl.HeapHeldBack)
	}
	f(800, fakeHeap{}, 0.8, 0)
	f(800, fakeHeap{spare: 300}, 0.5, 300)
	f(800, fakeHeap{spare: 100, heldBack: 50}, 0.75, 100)
	f(800, fakeHeap{heldBack: 400}, 1.2, 0)
	// More spare than the working set (read at another instant): the level
	// takes off at most all of it.
	f(200, fakeHeap{spare: 300}, 0, 200)
	f(200, fakeHeap{spare: 300, heldBack: 100}, 0.1, 200)
}

func TestMemoryIsNotSmoothed(t *testing.T) {
	src := newSource(900, cgroup.Limits{MemLimit: 1000})
	h := newHarness(Config{}, src)
	assert.InDelta(t, 0.9, h.step(0, 0).Mem, 1e-12)
	src.SetWorkingSet(100)
	assert.InDelta(t, 0.1, h.step(interval, 0).Mem, 1e-12)
}

func TestLimitsReadAtFirstTickAndEveryLimitsEvery(t *testing.T) {
	src := newSource(100, cgroup.Limits{QuotaCores: 2, MemLimit: 1000})
	h := newHarness(Config{LimitsEvery: time.Second}, src)

	wl := h.step(0, 0)
	assert.Equal(t, 1, src.Reads(testutil.Limits))
	assert.Equal(t, 2.0, wl.Cores)

	// A change is not seen before the slow cadence comes round.
	src.SetLimits(cgroup.Limits{QuotaCores: 1, MemLimit: 500})
	for range 3 {
		wl = h.step(interval, 0)
	}
	assert.Equal(t, 1, src.Reads(testutil.Limits))
	assert.Equal(t, 2.0, wl.Cores)
	assert.InDelta(t, 0.1, wl.Mem, 1e-12)

	wl = h.step(interval, 0) // 1s after the first read
	assert.Equal(t, 2, src.Reads(testutil.Limits))
	assert.Equal(t, 1.0, wl.Cores)
	assert.Equal(t, uint64(500), wl.MemLimit)
	assert.InDelta(t, 0.2, wl.Mem, 1e-12)

	for range 4 {
		h.step(interval, 0)
	}
	assert.Equal(t, 3, src.Reads(testutil.Limits))
}

func TestDefaultLimitsEvery(t *testing.T) {
	src := oneCore()
	h := newHarness(Config{}, src)
	h.step(0, 0)
	for range 39 {
		h.step(interval, 0)
	}
	assert.Equal(t, 1, src.Reads(testutil.Limits), "9.75s after the first read")
	h.step(interval, 0)
	assert.Equal(t, 2, src.Reads(testutil.Limits), "10s after the first read")
}

func TestReadErrors(t *testing.T) {
	boom := errors.New("boom")

	t.Run("cpu", func(t *testing.T) {
		h := newHarness(Config{}, oneCore())
		h.step(0, 0)
		seeded := h.step(interval, interval/2)

		h.src.Fail(testutil.CPUTime, boom)
		wl := h.step(interval, interval)
		require.Len(t, h.errs, 1)
		require.ErrorIs(t, h.errs[0], boom)
		assert.False(t, wl.CPUValid)
		assert.Equal(t, seeded.CPUSlow, wl.CPUSlow, "EWMA state kept")

		h.src.Fail(testutil.CPUTime, nil)
		// The baseline is the last good reading: this window spans 500ms
		// with 250ms+250ms of CPU, so x = 1, folded into the kept EWMAs.
		wl = h.step(interval, interval)
		require.True(t, wl.CPUValid)
		assert.InDelta(t, 1.0, wl.CPU, 1e-12)
		bf, bs := EWMABeta(interval, defaultCPUFastWindow), EWMABeta(interval, defaultCPUSlowWindow)
		assert.InDelta(t, (1-bf)*1+bf*0.5, wl.CPUFast, 1e-12)
		assert.InDelta(t, (1-bs)*1+bs*0.5, wl.CPUSlow, 1e-12)
	})

	t.Run("working set", func(t *testing.T) {
		src := newSource(500, cgroup.Limits{MemLimit: 1000})
		h := newHarness(Config{}, src)
		require.True(t, h.step(0, 0).MemValid)
		src.Fail(testutil.WorkingSet, boom)
		wl := h.step(interval, 0)
		assert.False(t, wl.MemValid)
		require.Len(t, h.errs, 1)
		require.ErrorIs(t, h.errs[0], boom)
		assert.Contains(t, h.errs[0].Error(), "working set")
	})

	t.Run("limits returned with an error are used", func(t *testing.T) {
		// The source returns the best limits it knows along with the error
		// (cgroup.Reader: what the readable levels say).
		src := newSource(500, cgroup.Limits{QuotaCores: 2, MemLimit: 1000})
		h := newHarness(Config{LimitsEvery: interval}, src)
		h.step(0, 0)
		src.SetLimits(cgroup.Limits{QuotaCores: 3, MemLimit: 800})
		src.Fail(testutil.Limits, boom)
		wl := h.step(interval, 0)
		require.Len(t, h.errs, 1)
		require.ErrorIs(t, h.errs[0], boom)
		assert.Equal(t, 3.0, wl.Cores)
		assert.True(t, wl.MemValid)
		assert.Equal(t, uint64(800), wl.MemLimit)
	})

	t.Run("limits never read", func(t *testing.T) {
		src := newSource(500, cgroup.Limits{})
		src.Fail(testutil.Limits, boom)
		h := newHarness(Config{CPU: CPUConfig{FallbackCores: 3}}, src)
		wl := h.step(0, 0)
		require.Len(t, h.errs, 1)
		assert.Equal(t, 3.0, wl.Cores)
		assert.False(t, wl.MemValid)
	})
}

func TestOnSampleReportsTook(t *testing.T) {
	clock := newClock()
	var took time.Duration
	src := &slowSource{Source: oneCore(), clock: clock, cost: 3 * time.Millisecond}
	s := New(src, Config{}, Options{
		Now:      clock.Now,
		OnSample: func(_ *WaterLevel, d time.Duration) { took = d },
	})
	s.Tick()
	assert.Equal(t, 3*time.Millisecond, took)
}

// slowSource advances the fake clock while reading memory, as a slow file read would.
type slowSource struct {
	*testutil.Source
	clock *testutil.Clock
	cost  time.Duration
}

func (s *slowSource) WorkingSet() (uint64, error) {
	s.clock.Advance(s.cost)
	return s.Source.WorkingSet()
}

func TestEffectiveCores(t *testing.T) {
	gomaxprocs := float64(runtime.GOMAXPROCS(0))
	tests := []struct {
		name     string
		limits   cgroup.Limits
		fallback float64
		want     float64
	}{
		{name: "quota only", limits: cgroup.Limits{QuotaCores: 2}, want: 2},
		{name: "fractional quota", limits: cgroup.Limits{QuotaCores: 1.5, CPUSetCores: 8}, want: 1.5},
		{name: "cpuset smaller than quota", limits: cgroup.Limits{QuotaCores: 4, CPUSetCores: 2}, want: 2},
		{name: "quota smaller than cpuset", limits: cgroup.Limits{QuotaCores: 0.5, CPUSetCores: 2}, want: 0.5},
		{name: "quota wins over fallback", limits: cgroup.Limits{QuotaCores: 1}, fallback: 8, want: 1},
		{name: "no quota uses fallback", limits: cgroup.Limits{CPUSetCores: 2}, fallback: 3, want: 3},
		{name: "fractional fallback", fallback: 0.5, want: 0.5},
		{name: "no quota, fallback 0 uses GOMAXPROCS", want: gomaxprocs},
		{name: "negative quota is none", limits: cgroup.Limits{QuotaCores: -1}, fallback: 2, want: 2},
		{name: "negative fallback uses GOMAXPROCS", fallback: -1, want: gomaxprocs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			assert.Equal(t, tt.want, EffectiveCores(tt.limits, tt.fallback))
		})
	}
}

func TestNewAppliesDefaults(t *testing.T) {
	s := New(oneCore(), Config{CPU: CPUConfig{FastWindow: 0, SlowWindow: -time.Second}}, Options{})
	assert.Equal(t, Config{
		Interval:    DefaultInterval,
		CPU:         CPUConfig{FastWindow: defaultCPUFastWindow, SlowWindow: defaultCPUSlowWindow},
		LimitsEvery: DefaultLimitsEvery,
	}, s.cfg)
	assert.Equal(t, EWMABeta(DefaultInterval, defaultCPUFastWindow), s.fastBeta)
	assert.Equal(t, EWMABeta(DefaultInterval, defaultCPUSlowWindow), s.slowBeta)
}

func TestStartStop(t *testing.T) {
	t.Run("stop without start", func(*testing.T) {
		s := New(oneCore(), Config{}, Options{})
		s.Stop()
		s.Stop()
	})

	t.Run("start samples then ticks until stopped", func(t *testing.T) {
		ticks := make(chan struct{}, 16)
		s := New(oneCore(), Config{Interval: time.Millisecond}, Options{
			OnSample: func(*WaterLevel, time.Duration) {
				select {
				case ticks <- struct{}{}:
				default:
				}
			},
		})
		require.NoError(t, s.Start(context.Background()))
		assert.False(t, s.Load().At.IsZero(), "Start takes one sample before returning")
		require.NoError(t, s.Start(context.Background())) // no second goroutine
		for range 3 {
			<-ticks
		}
		s.Stop()
		s.Stop()

		// Restartable.
		require.NoError(t, s.Start(context.Background()))
		<-ticks
		s.Stop()
	})

	t.Run("concurrent start and stop", func(*testing.T) {
		s := New(oneCore(), Config{Interval: time.Millisecond}, Options{})
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() { _ = s.Start(context.Background()) })
			wg.Go(s.Stop)
			wg.Go(s.Tick)
			wg.Go(func() { _ = s.Load() })
		}
		wg.Wait()
		s.Stop()
	})
}

// benchSource advances a fake clock and the CPU counter on every read, as a
// real tick would, without allocating.
type benchSource struct {
	clock *testutil.Clock
	cpu   time.Duration
}

func (b *benchSource) CPUTime() (time.Duration, error) {
	b.cpu += interval / 2
	return b.cpu, nil
}

// WorkingSet advances the clock after the CPU read, so that the read is not
// slow but the next tick's window is one interval.
func (b *benchSource) WorkingSet() (uint64, error) {
	b.clock.Advance(interval)
	return 600 << 20, nil
}

func (*benchSource) Limits() (cgroup.Limits, error) {
	return cgroup.Limits{QuotaCores: 1.5, CPUSetCores: 4, MemLimit: 1 << 30}, nil
}
func (*benchSource) Describe() string { return "bench" }

func BenchmarkTick(b *testing.B) {
	clock := newClock()
	s := New(&benchSource{clock: clock}, Config{}, Options{Now: clock.Now})
	s.Tick()
	b.ReportAllocs()
	for b.Loop() {
		s.Tick()
	}
	b.StopTimer()
	require.True(b, s.Load().CPUValid)
	require.True(b, s.Load().MemValid)
}

// BenchmarkTickCgroupFixture is one tick against the real cgroup reader on a
// fixture tree: the file reads are what a tick costs in production.
func BenchmarkTickCgroupFixture(b *testing.B) {
	for _, tree := range []string{"v2-container", "v1-separate"} {
		b.Run(tree, func(b *testing.B) {
			r, err := cgroup.NewReader("../cgroup/testdata/" + tree)
			require.NoError(b, err)
			clock := newClock()
			s := New(r, Config{}, Options{Now: clock.Now})
			s.Tick()
			b.ReportAllocs()
			for b.Loop() {
				clock.Advance(DefaultInterval)
				s.Tick()
			}
			b.StopTimer()
			require.True(b, s.Load().CPUValid)
			require.True(b, s.Load().MemValid)
		})
	}
}

// TestReaders: each check's Levels are its readers' readings of the check,
// in order, once CPU, memory and the limits are in; a reader past
// MaxResources is not called.
func TestReaders(t *testing.T) {
	src := newSource(512, cgroup.Limits{QuotaCores: 1, MemLimit: 1024})
	extra := 0
	readers := []Reader{ReadCPU, ReadMemory, func(wl *WaterLevel) Level {
		extra++
		return Level{Valid: wl.MemLimit == 1024, Value: 0.25, Slow: 0.25, Fast: 0.25}
	}}
	for len(readers) < MaxResources {
		readers = append(readers, func(*WaterLevel) Level { return Level{} })
	}
	readers = append(readers, func(*WaterLevel) Level { panic("a reader past MaxResources") })
	h := newHarness(Config{Readers: readers}, src)
	h.step(0, 0)
	wl := h.step(interval, interval/2)
	assert.Equal(t, Level{Valid: true, Value: 0.5, Slow: wl.CPUSlow, Fast: wl.CPUFast}, wl.Levels[0])
	assert.Equal(t, Level{Valid: true, Value: 0.5, Slow: 0.5, Fast: 0.5}, wl.Levels[1])
	assert.Equal(t, Level{Valid: true, Value: 0.25, Slow: 0.25, Fast: 0.25}, wl.Levels[2])
	assert.Equal(t, 2, extra, "once a check")
}
