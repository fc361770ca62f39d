// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package sampler

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// Fault injection. The documented outcomes:
//   - a failed read is reported to OnError as a *ReadError naming the
//     resource; CPU or memory is invalid in that frame (the CPU EWMAs are
//     kept for the next valid window), limits keep their previous value;
//   - a CPU window that cannot be trusted (counter backwards, short window,
//     slow read, impossible value) is skipped: OnError gets the matching
//     sentinel, the frame publishes the last CPU values and a fresh memory
//     level;
//   - every frame is published, nothing panics.
// Rate-limiting the Warn log and counting the metric are the extension's
// (extension/throttleextension/faults_test.go).

func TestReadErrorClassification(t *testing.T) {
	boom := errors.New("boom")
	tests := []struct {
		resource string
		set      func(*testutil.Source)
	}{
		{"cpu", func(f *testutil.Source) { f.Fail(testutil.CPUTime, boom) }},
		{"memory", func(f *testutil.Source) { f.Fail(testutil.WorkingSet, boom) }},
		{"limits", func(f *testutil.Source) { f.Fail(testutil.Limits, boom) }},
	}
	for _, tt := range tests {
		t.Run(tt.resource, func(t *testing.T) {
			src := oneCore()
			tt.set(src)
			h := newHarness(Config{}, src)
			h.step(0, 0)
			require.Len(t, h.errs, 1)
			var re *ReadError
			require.ErrorAs(t, h.errs[0], &re)
			assert.Equal(t, tt.resource, re.Resource)
			require.ErrorIs(t, h.errs[0], boom, "Unwrap reaches the source's error")
			assert.Equal(t, re.Err.Error(), re.Error())
			assert.Contains(t, re.Error(), "boom")
		})
	}

	t.Run("skipped windows are not ReadErrors", func(t *testing.T) {
		h := newHarness(Config{}, oneCore())
		h.src.SetCPUTime(time.Second)
		h.step(0, 0)
		h.src.SetCPUTime(0)
		h.step(interval, 0)
		require.Len(t, h.errs, 1)
		var re *ReadError
		assert.NotErrorAs(t, h.errs[0], &re)
		assert.ErrorIs(t, h.errs[0], ErrCPUCounterBackwards)
	})

	t.Run("wrapped", func(t *testing.T) {
		err := fmt.Errorf("context: %w", &ReadError{Resource: "memory", Err: fs.ErrNotExist})
		var re *ReadError
		require.ErrorAs(t, err, &re)
		assert.Equal(t, "memory", re.Resource)
		assert.ErrorIs(t, err, fs.ErrNotExist)
	})
}

// TestVanishingReadings: the source's files disappear and come back.
func TestVanishingReadings(t *testing.T) {
	src := newSource(500, cgroup.Limits{QuotaCores: 1, MemLimit: 1000})
	h := newHarness(Config{LimitsEvery: interval}, src)
	h.step(0, 0)
	seeded := h.step(interval, interval/2)
	require.True(t, seeded.CPUValid)
	require.True(t, seeded.MemValid)

	for _, r := range []testutil.Reading{testutil.CPUTime, testutil.WorkingSet, testutil.Limits} {
		src.Fail(r, fs.ErrNotExist)
	}
	for range 10 {
		wl := h.step(interval, interval)
		assert.False(t, wl.CPUValid)
		assert.False(t, wl.MemValid)
		assert.Equal(t, seeded.CPUSlow, wl.CPUSlow, "EWMAs kept")
		assert.Equal(t, 1.0, wl.Cores, "limits kept")
		assert.Equal(t, uint64(1000), wl.MemLimit, "limits kept")
	}
	assert.Len(t, h.errs, 30, "every failure is reported; the caller rate-limits")
	for _, err := range h.errs {
		require.ErrorIs(t, err, fs.ErrNotExist)
	}
	assert.Len(t, h.levels, 12, "every frame is published")

	for _, r := range []testutil.Reading{testutil.CPUTime, testutil.WorkingSet, testutil.Limits} {
		src.Fail(r, nil)
	}
	wl := h.step(interval, interval)
	assert.True(t, wl.CPUValid, "the baseline is the last good reading")
	assert.True(t, wl.MemValid)
	// 11 windows of 250ms with 11 * 250ms of CPU in them.
	assert.InDelta(t, 1.0, wl.CPU, 1e-9)
}

// TestContainerRestartCounterReset: the cgroup's CPU counter restarts near
// zero (a container restarted within the same cgroup) and counts on.
func TestContainerRestartCounterReset(t *testing.T) {
	h := newHarness(Config{}, oneCore())
	h.src.SetCPUTime(time.Hour)
	h.step(0, 0)
	for range 5 {
		h.step(interval, interval/2)
	}
	before := h.s.Load()

	h.src.SetCPUTime(10 * time.Millisecond)
	wl := h.step(interval, 0)
	require.Len(t, h.errs, 1)
	require.ErrorIs(t, h.errs[0], ErrCPUCounterBackwards)
	assert.Equal(t, before.CPUSlow, wl.CPUSlow)
	assert.True(t, wl.CPUValid)

	// Measured from the new origin, not from an hour ago.
	for range 5 {
		wl = h.step(interval, interval/2)
		assert.InDelta(t, 0.5, wl.CPU, 1e-12)
	}
	assert.Len(t, h.errs, 1)
}

// TestPartialReadLooksLikeAReset: a counter cut short ("usage_usec 12" for
// "usage_usec 123456789") reads as a counter reset, and the next good
// reading as an impossible jump forward. Both frames are skipped instead of
// folding a value of hundreds into the fast EWMA, which would hold it above
// hard (Open) for seconds.
func TestPartialReadLooksLikeAReset(t *testing.T) {
	h := newHarness(Config{}, oneCore())
	h.src.SetCPUTime(time.Hour)
	h.step(0, 0)
	before := h.step(interval, interval/2)

	h.src.SetCPUTime(12 * time.Microsecond) // the cut-short reading
	h.step(interval, 0)
	h.src.SetCPUTime(time.Hour + interval) // the real counter again
	wl := h.step(interval, 0)
	require.Len(t, h.errs, 2)
	require.ErrorIs(t, h.errs[0], ErrCPUCounterBackwards)
	require.ErrorIs(t, h.errs[1], ErrImpossibleCPU)
	assert.Equal(t, before.CPUFast, wl.CPUFast)
	assert.Equal(t, before.CPUSlow, wl.CPUSlow)

	wl = h.step(interval, interval/2)
	assert.InDelta(t, 0.5, wl.CPU, 1e-12, "the good reading is the new baseline")
	assert.Len(t, h.errs, 2)
}

func TestImpossibleCPUCeiling(t *testing.T) {
	cores := float64(max(runtime.NumCPU(), 4))
	src := newSource(0, cgroup.Limits{QuotaCores: 1, CPUSetCores: int(cores)})
	h := newHarness(Config{}, src)
	h.step(0, 0)
	// Every CPU busy for the whole window: a real (burst) reading of
	// cores times the quota, kept.
	wl := h.step(interval, time.Duration(cores)*interval)
	assert.InDelta(t, cores, wl.CPU, 1e-9)
	assert.Empty(t, h.errs)
	// Over twice what the CPUs could give: skipped.
	h.step(interval, time.Duration(2*cores+1)*interval)
	require.Len(t, h.errs, 1)
	assert.ErrorIs(t, h.errs[0], ErrImpossibleCPU)
}

// TestWallClockJump: the default clock is time.Now, whose readings carry a
// monotonic reading, and Time.Sub uses it when both sides have one: a jump
// of the wall clock (NTP step, manual date change) does not reach the
// windows. That cannot be simulated (the monotonic reading of a time.Time
// cannot be set), so the test checks that published times carry one. With
// an injected wall-only clock, a jump back is a skipped frame and a new
// baseline (not an hour of skipped frames); a jump forward is one diluted
// window, which only such a clock can produce.
func TestWallClockJump(t *testing.T) {
	t.Run("default clock is monotonic", func(t *testing.T) {
		s := New(oneCore(), Config{}, Options{})
		s.Tick()
		assert.Contains(t, s.Load().At.String(), " m=", "At carries a monotonic reading")
	})

	t.Run("injected wall clock jumps back", func(t *testing.T) {
		h := newHarness(Config{LimitsEvery: time.Second}, oneCore())
		h.step(0, 0)
		before := h.step(interval, interval/2)
		calls := h.src.Reads(testutil.Limits)

		wl := h.step(-time.Hour, interval/2)
		require.Len(t, h.errs, 1)
		require.ErrorIs(t, h.errs[0], ErrShortWindow)
		assert.Contains(t, h.errs[0].Error(), "clock went back")
		assert.Equal(t, before.CPUSlow, wl.CPUSlow)
		assert.Equal(t, calls+1, h.src.Reads(testutil.Limits), "limits re-read at once, not an hour later")

		wl = h.step(interval, interval/4)
		assert.InDelta(t, 0.25, wl.CPU, 1e-12, "measured again from the next tick")
		assert.Len(t, h.errs, 1)
	})

	t.Run("injected wall clock jumps forward", func(t *testing.T) {
		h := newHarness(Config{}, oneCore())
		h.step(0, 0)
		h.step(interval, interval/2)
		wl := h.step(time.Hour, interval)
		assert.True(t, wl.CPUValid)
		assert.Less(t, wl.CPU, 0.001, "one diluted window")
		assert.Empty(t, h.errs)
	})
}

// slowCPUSource advances the fake clock while the CPU counter is read.
type slowCPUSource struct {
	*testutil.Source
	clock *testutil.Clock
	cost  time.Duration
}

func (s *slowCPUSource) CPUTime() (time.Duration, error) {
	s.clock.Advance(s.cost)
	return s.Source.CPUTime()
}

// TestSlowRead: a CPU read that takes longer than a quarter of the interval
// (here longer than the interval itself) makes the counter's instant
// uncertain by as much: the frame is skipped and the baseline dropped.
func TestSlowRead(t *testing.T) {
	clock := newClock()
	src := &slowCPUSource{Source: oneCore(), clock: clock}
	var errs []error
	var tooks []time.Duration
	s := New(src, Config{Interval: interval}, Options{
		Now:      clock.Now,
		OnError:  func(err error) { errs = append(errs, err) },
		OnSample: func(_ *WaterLevel, took time.Duration) { tooks = append(tooks, took) },
	})
	step := func(wall, cpu time.Duration) *WaterLevel {
		clock.Advance(wall)
		src.AddCPUTime(cpu)
		s.Tick()
		return s.Load()
	}
	step(0, 0)
	before := step(interval, interval/2)
	require.True(t, before.CPUValid)

	src.cost = 3 * interval
	wl := step(interval, 3*interval)
	require.Len(t, errs, 1)
	require.ErrorIs(t, errs[0], ErrSlowRead)
	assert.True(t, wl.CPUValid, "validity carried over")
	assert.Equal(t, before.CPUSlow, wl.CPUSlow)
	assert.Equal(t, 3*interval, tooks[len(tooks)-1], "OnSample reports the slow tick")

	// A quarter of the interval is still acceptable.
	src.cost = interval / 4
	wl = step(interval, interval/2)
	assert.Len(t, errs, 1)
	assert.Equal(t, before.CPUSlow, wl.CPUSlow, "new baseline, no window yet")
	wl = step(interval, interval/2)
	assert.NotEqual(t, before.CPU, wl.CPU, "a window again")
	assert.Len(t, errs, 1)
}

// TestTickLongerThanInterval: on the real ticker, a tick that blocks for
// many intervals does not queue ticks up (time.Ticker drops them), the
// first window after it is skipped as a slow read, ticking resumes, and Stop
// returns once the read does.
func TestTickLongerThanInterval(t *testing.T) {
	const iv = 5 * time.Millisecond
	src := oneCore()
	var mu sync.Mutex
	var errs []error
	samples := make(chan *WaterLevel, 64)
	s := New(src, Config{Interval: iv}, Options{
		OnError: func(err error) { mu.Lock(); errs = append(errs, err); mu.Unlock() },
		OnSample: func(wl *WaterLevel, _ time.Duration) {
			select {
			case samples <- wl:
			default:
			}
		},
	})
	require.NoError(t, s.Start(context.Background()))
	defer s.Stop()
	<-samples

	release := src.BlockCPUTime(t)
	time.Sleep(10 * iv) // the simulated stall, not a synchronisation
	release()

	// Drain and wait for a few more samples: ticking resumed.
	drain := func() {
		for {
			select {
			case <-samples:
			default:
				return
			}
		}
	}
	drain()
	for range 3 {
		<-samples
	}
	mu.Lock()
	defer mu.Unlock()
	require.NotEmpty(t, errs)
	var slow bool
	for _, err := range errs {
		slow = slow || errors.Is(err, ErrSlowRead)
	}
	assert.True(t, slow, "the stalled read's window was skipped: %v", errs)
}

// TestCgroupLevelBadFromStart: one level of the hierarchy (the pod's cpu.max
// is garbage, its memory.max unreadable) fails from the first read on. The
// other levels' limits are used (the parent's 3-core quota, the leaf's
// 2 GiB, so the memory signal is on) and the failure is reported at every
// limits read.
func TestCgroupLevelBadFromStart(t *testing.T) {
	r, err := cgroup.NewReader(filepath.Join("..", "cgroup", "testdata", "v2-bad-level"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	clock := newClock()
	var errs []error
	s := New(r, Config{Interval: interval, LimitsEvery: interval}, Options{
		Now:     clock.Now,
		OnError: func(err error) { errs = append(errs, err) },
	})
	for i := range 3 {
		clock.Advance(interval)
		s.Tick()
		wl := s.Load()
		assert.Equal(t, 3.0, wl.Cores, "tick %d", i)
		assert.Equal(t, uint64(2<<30), wl.MemLimit, "tick %d", i)
		assert.True(t, wl.MemValid, "tick %d", i)
		require.Len(t, errs, i+1)
		assert.Equal(t, "limits", readErrorOf(t, errs[i]).Resource)
		assert.Contains(t, errs[i].Error(), "pod1/memory.max")
	}
}

// copyFixture copies one of internal/cgroup's fixture trees into a temporary
// folder the test may break.
func copyFixture(t *testing.T, name string) string {
	t.Helper()
	root := filepath.Join(t.TempDir(), "root")
	require.NoError(t, os.CopyFS(root, os.DirFS(filepath.Join("..", "cgroup", "testdata", name))))
	return root
}

// cgroupHarness is a sampler on the real cgroup reader over a fixture copy.
type cgroupHarness struct {
	t     *testing.T
	dir   string // the cgroup directory in the copy
	r     *cgroup.Reader
	clock *testutil.Clock
	s     *Sampler
	errs  []error
}

func newCgroupHarness(t *testing.T) *cgroupHarness {
	root := copyFixture(t, "v2-container")
	r, err := cgroup.NewReader(root)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })
	h := &cgroupHarness{t: t, dir: filepath.Join(root, "sys", "fs", "cgroup"), r: r, clock: newClock()}
	h.s = New(r, Config{Interval: interval, LimitsEvery: interval}, Options{
		Now:     h.clock.Now,
		OnError: func(err error) { h.errs = append(h.errs, err) },
	})
	return h
}

func (h *cgroupHarness) write(file, content string) {
	require.NoError(h.t, os.WriteFile(filepath.Join(h.dir, file), []byte(content), 0o644))
}

// setUsage writes cpu.stat with usage_usec us.
func (h *cgroupHarness) setUsage(us int64) {
	h.write("cpu.stat", fmt.Sprintf("usage_usec %d\nuser_usec 0\nsystem_usec 0\n", us))
}

// replaceWithDir removes file and puts a directory of the same name in its
// place: a file that cannot be read even by root (tests run as root, for
// whom chmod 000 changes nothing).
func (h *cgroupHarness) replaceWithDir(file string) {
	p := filepath.Join(h.dir, file)
	require.NoError(h.t, os.Remove(p))
	require.NoError(h.t, os.Mkdir(p, 0o755))
}

func (h *cgroupHarness) tick() *WaterLevel {
	h.clock.Advance(interval)
	h.s.Tick()
	return h.s.Load()
}

// lastErr returns the errors since the previous call.
func (h *cgroupHarness) take() []error {
	errs := h.errs
	h.errs = nil
	return errs
}

func readErrorOf(t *testing.T, err error) *ReadError {
	t.Helper()
	var re *ReadError
	require.ErrorAs(t, err, &re, "%v", err)
	return re
}

// 2.5 cores (cpu.max 250000 100000); 512 MiB limit; 80 MiB working set.
const fixtureMem = 80.0 / 512

func TestCgroupFaults(t *testing.T) {
	t.Run("garbage and partial lines", func(t *testing.T) {
		h := newCgroupHarness(t)
		h.setUsage(1_000_000)
		h.tick()
		h.setUsage(1_000_000 + 125_000) // 0.125s of 2.5 cores in 0.25s = 0.2
		wl := h.tick()
		require.Empty(t, h.take())
		require.True(t, wl.CPUValid)
		require.InDelta(t, 0.2, wl.CPU, 1e-9)
		require.InDelta(t, fixtureMem, wl.Mem, 1e-9)

		for _, tc := range []struct{ file, content, resource string }{
			{"cpu.stat", "usage_usec abc\n", "cpu"},
			{"cpu.stat", "usage_u", "cpu"},
			{"cpu.stat", "", "cpu"},
			{"memory.current", "garbage\n", "memory"},
			{"memory.current", "", "memory"},
			{"memory.stat", "anon 1\ninactive_fi", "memory"},
			{"memory.max", "lots\n", "limits"},
			{"cpu.max", "250000\n", "limits"},
		} {
			orig, err := os.ReadFile(filepath.Join(h.dir, tc.file))
			require.NoError(t, err)
			h.write(tc.file, tc.content)
			wl := h.tick()
			errs := h.take()
			require.Len(t, errs, 1, "%s %q: %v", tc.file, tc.content, errs)
			assert.Equal(t, tc.resource, readErrorOf(t, errs[0]).Resource, "%s %q", tc.file, tc.content)
			switch tc.resource {
			case "cpu":
				assert.False(t, wl.CPUValid, "%s %q", tc.file, tc.content)
				assert.True(t, wl.MemValid)
			case "memory":
				assert.False(t, wl.MemValid, "%s %q", tc.file, tc.content)
			case "limits":
				assert.Equal(t, 2.5, wl.Cores, "previous limits kept")
				assert.Equal(t, uint64(512<<20), wl.MemLimit, "previous limits kept")
				assert.True(t, wl.MemValid)
			}
			h.write(tc.file, string(orig))
			h.tick()
			require.Empty(t, h.take(), "recovered after %s %q", tc.file, tc.content)
		}
	})

	t.Run("a cut-short counter", func(t *testing.T) {
		h := newCgroupHarness(t)
		h.setUsage(123_456_789)
		h.tick()
		h.setUsage(123_456_789 + 125_000)
		before := h.tick()
		h.setUsage(123) // "usage_usec 123" of "usage_usec 123456789..."
		h.tick()
		h.setUsage(123_456_789 + 250_000)
		wl := h.tick()
		errs := h.take()
		require.Len(t, errs, 2)
		require.ErrorIs(t, errs[0], ErrCPUCounterBackwards)
		require.ErrorIs(t, errs[1], ErrImpossibleCPU)
		assert.Equal(t, before.CPUFast, wl.CPUFast, "the glitch never reached the EWMAs")
	})

	t.Run("counter reset", func(t *testing.T) {
		h := newCgroupHarness(t)
		h.setUsage(50_000_000)
		h.tick()
		h.setUsage(50_125_000)
		h.tick()
		h.setUsage(1_000) // container restarted in the same cgroup
		wl := h.tick()
		errs := h.take()
		require.Len(t, errs, 1)
		require.ErrorIs(t, errs[0], ErrCPUCounterBackwards)
		assert.True(t, wl.CPUValid)
		h.setUsage(1_000 + 62_500)
		wl = h.tick()
		assert.InDelta(t, 0.1, wl.CPU, 1e-9)
		assert.Empty(t, h.take())
	})

	// On a regular file system an unlinked file stays readable through the
	// descriptor the reader keeps open, so removal is seen when the file is
	// opened: at the first read, or after the descriptor was dropped (any
	// failed read drops it; Close here). On cgroupfs a removed cgroup's
	// open files fail with ENODEV at once, and the process has moved, which
	// Limits follows.
	t.Run("files vanish", func(t *testing.T) {
		h := newCgroupHarness(t)
		h.tick()
		h.tick()
		require.Empty(t, h.take())
		require.NoError(t, os.Remove(filepath.Join(h.dir, "memory.current")))
		require.NoError(t, os.Remove(filepath.Join(h.dir, "cpu.stat")))
		require.NoError(t, h.r.Close())
		for range 5 {
			wl := h.tick()
			assert.False(t, wl.CPUValid)
			assert.False(t, wl.MemValid)
			assert.Equal(t, 2.5, wl.Cores)
		}
		errs := h.take()
		require.NotEmpty(t, errs)
		got := map[string]int{}
		for _, err := range errs {
			got[readErrorOf(t, err).Resource]++
			require.ErrorIs(t, err, fs.ErrNotExist)
		}
		assert.Equal(t, map[string]int{"cpu": 5, "memory": 5}, got)

		h.setUsage(123_456_789)
		h.write("memory.current", "104857600\n")
		wl := h.tick()
		assert.True(t, wl.MemValid, "memory.current reopened")
		assert.True(t, wl.CPUValid, "cpu.stat reopened")
		assert.Empty(t, h.take())
	})

	t.Run("files become unreadable", func(t *testing.T) {
		h := newCgroupHarness(t)
		h.tick()
		h.tick()
		require.Empty(t, h.take())
		h.replaceWithDir("cpu.stat")
		h.replaceWithDir("memory.current")
		h.replaceWithDir("cpu.max")
		require.NoError(t, h.r.Close())
		wl := h.tick()
		errs := h.take()
		got := map[string]bool{}
		for _, err := range errs {
			re := readErrorOf(t, err)
			got[re.Resource] = true
			assert.Contains(t, err.Error(), "is a directory", "%v", err)
		}
		assert.Equal(t, map[string]bool{"cpu": true, "memory": true, "limits": true}, got)
		assert.False(t, wl.CPUValid)
		assert.False(t, wl.MemValid)
		assert.Equal(t, 2.5, wl.Cores, "previous limits kept")
	})
}
