package throttleextension

import (
	"context"
	"math"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// newResizableSource is a container with memory limit limit and one core,
// a tenth of it used; SetLimits resizes it in place (an in-place pod resize).
func newResizableSource(limit uint64) *testutil.Source {
	src := testutil.NewSource(cgroup.Limits{MemLimit: limit, QuotaCores: 1})
	src.SetWorkingSet(limit / 10)
	return src
}

// fakeMemoryLimit stands in for debug.SetMemoryLimit and records every set.
type fakeMemoryLimit struct {
	mu    sync.Mutex
	limit int64
	sets  []int64
}

func newFakeMemoryLimit() *fakeMemoryLimit { return &fakeMemoryLimit{limit: math.MaxInt64} }

func (f *fakeMemoryLimit) set(v int64) int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	prev := f.limit
	if v >= 0 {
		f.limit = v
		f.sets = append(f.sets, v)
	}
	return prev
}

func (f *fakeMemoryLimit) get() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.limit
}

func (f *fakeMemoryLimit) setCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.sets)
}

func startResizable(t *testing.T, src *testutil.Source, ml *fakeMemoryLimit, mutate ...func(*Config)) (*throttleExtension, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	set := nopSettings()
	set.Logger = zap.New(core)
	f := newFactory(factoryOptions{source: src, memoryLimit: ml.set, limitsEvery: 20 * time.Millisecond})
	ext, err := f.Create(context.Background(), set, testConfig(t, mutate...))
	require.NoError(t, err)
	e := ext.(*throttleExtension)
	require.NoError(t, e.Start(context.Background(), nil))
	t.Cleanup(func() { require.NoError(t, e.Shutdown(context.Background())) })
	return e, logs
}

// TestGoMemLimitFollowsTheContainer: with GOMEMLIMIT unset, the throttle
// sets the soft memory limit to memory::soft_limit::share of the memory limit,
// logs it at start, follows the limit when it changes, and gives the limit
// back at shutdown.
func TestGoMemLimitFollowsTheContainer(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	src := newResizableSource(100 << 20)
	ml := newFakeMemoryLimit()
	e, logs := startResizable(t, src, ml)
	assert.Equal(t, int64(80<<20), ml.get(), "0.80 of the memory limit")
	started := logs.FilterMessage("throttle started").All()
	require.Len(t, started, 1)
	assert.Equal(t, "owned by throttle", started[0].ContextMap()["go_memory_limit"])
	assert.Equal(t, int64(80<<20), started[0].ContextMap()["go_memory_limit_bytes"])

	src.SetLimits(cgroup.Limits{MemLimit: 200 << 20, QuotaCores: 1})
	require.Eventually(t, func() bool { return ml.get() == 160<<20 }, 10*time.Second, time.Millisecond, "follows a resize")
	require.Eventually(t, func() bool {
		return logs.FilterMessage("throttle: the Go soft memory limit follows the memory limit").Len() == 1
	}, 10*time.Second, time.Millisecond)

	require.NoError(t, e.Shutdown(context.Background()))
	assert.Equal(t, int64(math.MaxInt64), ml.get(), "given back at shutdown")
}

func TestGoMemLimitRespectsTheEnvironment(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "64MiB")
	ml := newFakeMemoryLimit()
	ml.limit = 64 << 20 // the runtime applied it at start
	_, logs := startResizable(t, newResizableSource(100<<20), ml)
	assert.Zero(t, ml.setCount(), "never set")
	assert.Equal(t, int64(64<<20), ml.get())
	started := logs.FilterMessage("throttle started").All()
	require.Len(t, started, 1)
	assert.Equal(t, "set by the GOMEMLIMIT environment variable", started[0].ContextMap()["go_memory_limit"])
}

func TestGoMemLimitTurnedOff(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "")
	ml := newFakeMemoryLimit()
	e, _ := startResizable(t, newResizableSource(100<<20), ml, func(c *Config) { c.Memory.SoftLimit.Enabled = false })
	require.NoError(t, e.Shutdown(context.Background()))
	assert.Zero(t, ml.setCount(), "memory::soft_limit::enabled: false never sets it")
}

// TestAutoBudgetFollowsTheContainer: the "auto" admission budget is sized
// at start from the memory limit and the cores, and follows both when they
// change.
func TestAutoBudgetFollowsTheContainer(t *testing.T) {
	src := newResizableSource(300 << 20)
	e, _ := startResizable(t, src, newFakeMemoryLimit())
	require.EqualValues(t, 10<<20, e.runner.MiddlewareConfig().Admission.Stats().Budget, "1 core: 10 MiB")
	src.SetLimits(cgroup.Limits{MemLimit: 300 << 20, QuotaCores: 4})
	require.Eventually(t, func() bool { return e.runner.MiddlewareConfig().Admission.Stats().Budget == 25<<20 }, 10*time.Second, time.Millisecond,
		"4 cores: the memory limit's share, 300 MiB / 12")
	src.SetLimits(cgroup.Limits{MemLimit: 120 << 20, QuotaCores: 4})
	require.Eventually(t, func() bool { return e.runner.MiddlewareConfig().Admission.Stats().Budget == 10<<20 }, 10*time.Second, time.Millisecond,
		"a smaller limit: 120 MiB / 12")
}

// gcPercent reads the process's GOGC (debug.SetGCPercent cannot read it
// without changing it).
func gcPercent() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestGCPaceWithTheDefaultSource starts the extension on this process's own
// cgroup: it owns GOGC unless GOGC is set or heap_target is 0, raises it
// only under a soft memory limit, and gives GOGC's default back at
// shutdown. Not parallel: GOGC is the process's.
func TestGCPaceWithTheDefaultSource(t *testing.T) {
	if g := gcPercent(); g != 100 {
		t.Skipf("the test process runs at GOGC=%d", g)
	}
	start := func(t *testing.T, mutate ...func(*Config)) (*throttleExtension, string) {
		t.Helper()
		core, logs := observer.New(zap.InfoLevel)
		set := nopSettings()
		set.Logger = zap.New(core)
		e := newTestExtension(t, nil, testConfig(t, mutate...), set)
		require.NoError(t, e.Start(context.Background(), nil))
		started := logs.FilterMessage("throttle started").All()
		require.Len(t, started, 1)
		return e, started[0].ContextMap()["gc_pace"].(string)
	}
	t.Run("owned, given back", func(t *testing.T) {
		if v := debug.SetMemoryLimit(-1); v != math.MaxInt64 {
			t.Skipf("the test process already has a soft memory limit (%d)", v)
		}
		// The working set this machine reports for the process (its whole
		// cgroup's) comes off the heap's target: a limit of twice it and
		// 2 GiB more leaves the heap 1 GiB, and the pace rises while almost
		// nothing is live.
		ws := thisProcessWorkingSet(t)
		e, pace := start(t, func(c *Config) { c.Memory.LimitMiB = 2*(ws>>20) + 2048 })
		assert.Equal(t, "owned by throttle", pace)
		assert.Eventually(t, func() bool { return gcPercent() > 1000 }, 5*time.Second, 10*time.Millisecond,
			"GOGC stayed at %d", gcPercent())
		require.NoError(t, e.Shutdown(context.Background()))
		assert.Equal(t, uint64(100), gcPercent(), "given back at shutdown")
		assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "the soft limit too")
	})
	t.Run("no soft limit: the default pace", func(t *testing.T) {
		e, pace := start(t, func(c *Config) { c.Memory.LimitMiB = 1024; c.Memory.SoftLimit.Enabled = false })
		assert.Equal(t, "owned by throttle", pace)
		time.Sleep(50 * time.Millisecond) // a few samples
		assert.Equal(t, uint64(100), gcPercent())
		require.NoError(t, e.Shutdown(context.Background()))
	})
	t.Run("GOGC set", func(t *testing.T) {
		t.Setenv("GOGC", "100")
		e, pace := start(t)
		assert.Equal(t, "set by the GOGC environment variable", pace)
		require.NoError(t, e.Shutdown(context.Background()))
	})
	t.Run("heap_target 0", func(t *testing.T) {
		e, pace := start(t, func(c *Config) { c.Memory.SoftLimit.HeapTarget = 0 })
		assert.Equal(t, "not set by throttle (memory::soft_limit::heap_target: 0)", pace)
		time.Sleep(50 * time.Millisecond) // a few samples
		assert.Equal(t, uint64(100), gcPercent())
		require.NoError(t, e.Shutdown(context.Background()))
	})
}

// thisProcessWorkingSet reads the working set where the extension's default
// source does: this process's cgroup, or its own counters where there is
// none.
func thisProcessWorkingSet(t *testing.T) uint64 {
	t.Helper()
	var src interface {
		sampler.Source
		Close() error
	}
	if r, err := cgroup.NewReader("/"); err == nil {
		src = r
	} else {
		src = cgroup.NewProcess("/")
	}
	defer src.Close()
	ws, err := src.WorkingSet()
	require.NoError(t, err)
	return ws
}
