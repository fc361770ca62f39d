// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package decision

import (
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/testutil"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// frame is one water level in a test sequence: the CPU slot's slow and fast
// inputs and the memory level. A negative value makes that signal invalid.
type frame struct{ slow, fast, mem float64 }

func (f frame) level() *sampler.WaterLevel {
	return lv(&sampler.WaterLevel{
		CPUSlow: f.slow, CPUFast: f.fast, CPU: f.fast, CPUValid: f.slow >= 0 && f.fast >= 0,
		Mem: f.mem, MemValid: f.mem >= 0,
	})
}

// The tests' two slots, as the extension registers them: CPU, a rate, and
// memory, a level and the backstop.
const (
	cpuSlot = 0
	memSlot = 1
)

// lv fills wl's levels from its CPU and memory fields, as the sampler's
// readers of the two slots do.
func lv(wl *sampler.WaterLevel) *sampler.WaterLevel {
	wl.Levels[cpuSlot] = sampler.ReadCPU(wl)
	wl.Levels[memSlot] = sampler.ReadMemory(wl)
	return wl
}

// defaultConfig is the two slots at the extension's default lines and
// breach_duration (at a 250ms check interval), every signal's rule the
// default one, and the default recovery ramp.
func defaultConfig() Config {
	cfg := Config{
		Slots: []Slot{
			{Name: "cpu", Enabled: true, Enter: 0.90, Exit: 0.80, Hard: 1.10, BreachN: 3, MaxShed: 0.2, Severity: SeverityRate},
			{Name: "memory", Enabled: true, Enter: 0.85, Exit: 0.78, Hard: 0.92, BreachN: 1, MaxShed: 1, Severity: SeverityLevel, Backstop: true},
		},
		RecoveryRamp: DefaultRecoveryRamp,
		Interval:     sampler.DefaultInterval,
	}
	for i := range cfg.Rules {
		cfg.Rules[i] = DefaultRule()
	}
	return cfg
}

// withRelief is cfg with relieve as the memory slot's relief.
func withRelief(cfg Config, relieve func()) Config {
	cfg.Slots[memSlot].Relieve = relieve
	return cfg
}

// Shorthands: cpuOnly leaves memory invalid, memOnly leaves CPU invalid.
func cpuOnly(slow, fast float64) frame { return frame{slow, fast, -1} }
func memOnly(mem float64) frame        { return frame{-1, -1, mem} }

// newClock is a manual clock for the engine's Now.
func newClock() *testutil.Clock { return testutil.NewClock(time.Unix(1_000_000, 0)) }

// fixedRand returns a Rand that always draws r.
func fixedRand(r float64) func() float64 { return func() float64 { return r } }

// statesString is the sequence of states as "N S O" letters, for readable
// sequence assertions.
func stateLetter(s State) string { return strings.ToUpper(s.String()[:1]) }

// feed observes every frame and returns the state after each as letters.
func feed(e *Engine, frames ...frame) string {
	var b strings.Builder
	for _, f := range frames {
		e.Observe(f.level())
		b.WriteString(stateLetter(e.State(SignalTraces)))
	}
	return b.String()
}

// linesConfig is the configuration the state-machine tests are written
// against: the defaults with explicit CPU lines 0.80/0.70/0.90 under the
// quota, so that the tests exercise the transitions whatever the defaults.
func linesConfig() Config {
	cfg := defaultConfig()
	c := &cfg.Slots[cpuSlot]
	c.Enter, c.Exit, c.Hard, c.BreachN, c.MaxShed = 0.80, 0.70, 0.90, 3, 0
	return cfg
}

// testConfig is linesConfig with both slots' breach_n set and no ramp.
func testConfig(cpuN, memN int) Config {
	cfg := linesConfig()
	cfg.Slots[cpuSlot].BreachN = cpuN
	cfg.Slots[memSlot].BreachN = memN
	cfg.RecoveryRamp = 0
	return cfg
}

func repeat(f frame, n int) []frame {
	out := make([]frame, n)
	for i := range out {
		out[i] = f
	}
	return out
}

func concat(parts ...[]frame) []frame {
	var out []frame
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// Levels used below against linesConfig (cpu 0.80/0.70/0.90, mem 0.85/0.78/0.92).
var (
	calm       = frame{0.50, 0.50, 0.50}
	cpuBand    = cpuOnly(0.75, 0.75) // between exit and enter
	cpuEnter   = cpuOnly(0.85, 0.85) // slow > enter, fast < hard
	cpuHard    = cpuOnly(0.60, 0.95) // fast >= hard only
	cpuEnterHd = cpuOnly(0.85, 0.95) // both
	cpuCalm    = cpuOnly(0.50, 0.50)
	cpuResid   = cpuOnly(0.75, 0.80) // under hard, slow still > exit
)

func TestTransitionTable(t *testing.T) {
	toShedding := repeat(cpuEnter, 3)
	toOpen := repeat(cpuHard, 3)
	tests := []struct {
		name   string
		cpuN   int
		memN   int
		frames []frame
		want   string
	}{
		{
			name:   "Normal->Shedding: slow > enter for breach_n frames",
			cpuN:   3,
			frames: repeat(cpuEnter, 4),
			want:   "NNSS",
		},
		{
			name:   "Normal stays at slow == enter",
			cpuN:   1,
			frames: repeat(cpuOnly(0.80, 0.80), 3),
			want:   "NNN",
		},
		{
			name:   "Normal->Open: fast >= hard for breach_n frames",
			cpuN:   3,
			frames: repeat(cpuHard, 3),
			want:   "NNO",
		},
		{
			name:   "Normal->Open at fast == hard",
			cpuN:   1,
			frames: []frame{cpuOnly(0.5, 0.90)},
			want:   "O",
		},
		{
			name:   "Normal->Open wins over Normal->Shedding in the same frame",
			cpuN:   3,
			frames: repeat(cpuEnterHd, 3),
			want:   "NNO",
		},
		{
			name:   "Shedding->Open: fast >= hard for breach_n frames",
			cpuN:   3,
			frames: concat(toShedding, repeat(cpuEnterHd, 3)),
			want:   "NNS" + "SSO",
		},
		{
			name:   "Shedding->Open wins over Shedding->Normal in the same frame",
			cpuN:   2,
			frames: concat(repeat(cpuEnter, 2), repeat(cpuOnly(0.60, 0.95), 2)),
			want:   "NS" + "SO",
		},
		{
			name:   "Shedding->Normal: every slot slow < exit for breach_n frames",
			cpuN:   3,
			frames: concat(toShedding, repeat(cpuCalm, 3)),
			want:   "NNS" + "SSN",
		},
		{
			name:   "Shedding stays in the hysteresis band",
			cpuN:   3,
			frames: concat(toShedding, repeat(cpuBand, 5)),
			want:   "NNS" + "SSSSS",
		},
		{
			name:   "Shedding stays at slow == exit",
			cpuN:   1,
			frames: []frame{cpuEnter, cpuOnly(0.70, 0.70), cpuOnly(0.70, 0.70)},
			want:   "SSS",
		},
		{
			name:   "Open->Shedding: fast < hard for breach_n frames, slow > exit now",
			cpuN:   3,
			frames: concat(toOpen, repeat(cpuResid, 3)),
			want:   "NNO" + "OOS",
		},
		{
			name:   "Open->Normal: fast < hard for breach_n frames, slow <= exit now",
			cpuN:   3,
			frames: concat(toOpen, repeat(cpuCalm, 3)),
			want:   "NNO" + "OON",
		},
		{
			name:   "Open stays while fast >= hard",
			cpuN:   1,
			frames: repeat(cpuHard, 3),
			want:   "OOO",
		},
		{
			name:   "Open->Normal at slow == exit",
			cpuN:   1,
			frames: []frame{cpuHard, cpuOnly(0.70, 0.70)},
			want:   "ON",
		},
		{
			name:   "memory, breach_n 1: Normal->Shedding->Open->Shedding->Normal",
			memN:   1,
			frames: []frame{memOnly(0.80), memOnly(0.86), memOnly(0.93), memOnly(0.88), memOnly(0.80), memOnly(0.77)},
			want:   "NSOSSN",
		},
		{
			name:   "memory, breach_n 1: Open->Normal after a GC",
			memN:   1,
			frames: []frame{memOnly(0.95), memOnly(0.60)},
			want:   "ON",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(testConfig(max(tt.cpuN, 1), max(tt.memN, 1)), Options{})
			assert.Equal(t, tt.want, feed(e, tt.frames...))
		})
	}
}

func TestWorsenIsOrRecoverIsAnd(t *testing.T) {
	t.Run("either slot alone worsens", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		assert.Equal(t, "S", feed(e, frame{0.85, 0.85, 0.50}), "cpu alone")
		e = New(testConfig(1, 1), Options{})
		assert.Equal(t, "S", feed(e, frame{0.50, 0.50, 0.86}), "mem alone")
		e = New(testConfig(1, 1), Options{})
		assert.Equal(t, "O", feed(e, frame{0.50, 0.95, 0.50}), "cpu hard alone")
		e = New(testConfig(1, 1), Options{})
		assert.Equal(t, "O", feed(e, frame{0.50, 0.50, 0.92}), "mem hard alone")
	})
	t.Run("Shedding->Normal needs every slot", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		assert.Equal(t, "SSSN", feed(e,
			frame{0.85, 0.85, 0.86}, // both above enter
			frame{0.50, 0.50, 0.80}, // cpu recovered, mem in its band
			frame{0.50, 0.50, 0.79},
			frame{0.50, 0.50, 0.77}, // both below exit
		))
	})
	t.Run("Open needs every slot under hard", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		assert.Equal(t, "OOON", feed(e,
			frame{0.50, 0.95, 0.95},
			frame{0.50, 0.50, 0.93}, // cpu cleared, mem still at hard
			frame{0.50, 0.95, 0.50}, // mem cleared, cpu back at hard
			frame{0.50, 0.50, 0.50},
		))
	})
	t.Run("Open->Shedding when any slot is above exit now", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		assert.Equal(t, "OS", feed(e, frame{0.50, 0.95, 0.50}, frame{0.50, 0.50, 0.79}))
	})
	t.Run("breach_n is per slot", func(t *testing.T) {
		e := New(testConfig(3, 1), Options{})
		// Memory (breach_n 1) recovers at once; cpu (3) must be under exit for 3 frames.
		assert.Equal(t, "SSSSN", feed(e,
			frame{0.75, 0.75, 0.86},
			frame{0.75, 0.75, 0.86},
			frame{0.60, 0.60, 0.50},
			frame{0.60, 0.60, 0.50},
			frame{0.60, 0.60, 0.50},
		))
	})
}

func TestBreachCountersResetWhenStreakBreaks(t *testing.T) {
	tests := []struct {
		name   string
		frames []frame
		want   string
	}{
		{
			name:   "slow > enter",
			frames: []frame{cpuEnter, cpuEnter, cpuBand, cpuEnter, cpuEnter, cpuEnter},
			want:   "NNNNNS",
		},
		{
			name:   "fast >= hard",
			frames: []frame{cpuHard, cpuHard, cpuCalm, cpuHard, cpuHard, cpuHard},
			want:   "NNNNNO",
		},
		{
			name:   "slow < exit",
			frames: concat(repeat(cpuEnter, 3), []frame{cpuCalm, cpuCalm, cpuBand, cpuCalm, cpuCalm, cpuCalm}),
			want:   "NNS" + "SSSSSN",
		},
		{
			name:   "fast < hard",
			frames: concat(repeat(cpuHard, 3), []frame{cpuCalm, cpuCalm, cpuHard, cpuCalm, cpuCalm, cpuCalm}),
			want:   "NNO" + "OOOOON",
		},
		{
			name:   "an invalid frame breaks a streak",
			frames: []frame{cpuEnter, cpuEnter, cpuOnly(-1, -1), cpuEnter, cpuEnter, cpuEnter},
			want:   "NNNNNS",
		},
		{
			name: "streaks count across a state change",
			// Two frames at hard in Normal count towards Shedding->Open.
			frames: []frame{cpuEnter, cpuEnterHd, cpuEnterHd, cpuEnterHd},
			want:   "NNSO",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(testConfig(3, 1), Options{})
			assert.Equal(t, tt.want, feed(e, tt.frames...))
		})
	}
}

func TestInvalidMemoryCountsAsSafe(t *testing.T) {
	invalidHigh := func(slow, fast float64) *sampler.WaterLevel {
		// A memory level far over hard, but marked invalid (no limit).
		return lv(&sampler.WaterLevel{CPUSlow: slow, CPUFast: fast, CPUValid: true, Mem: 5, MemValid: false})
	}
	freed := 0
	e := New(withRelief(testConfig(1, 1), func() { freed++ }), Options{Rand: fixedRand(0.5)})

	e.Observe(invalidHigh(0.5, 0.5))
	assert.Equal(t, StateNormal, e.State(SignalTraces), "never triggers")

	e.Observe(invalidHigh(0.85, 0.85))
	require.Equal(t, StateShedding, e.State(SignalTraces))
	assert.InDelta(t, shareGain*0.25*0.05, e.Stat().Signals[SignalTraces].DropProbability, 1e-9, "not in p_drop: the CPU share only")

	e.Observe(invalidHigh(0.5, 0.5))
	assert.Equal(t, StateNormal, e.State(SignalTraces), "never blocks Shedding->Normal")

	e.Observe(invalidHigh(0.5, 0.95))
	require.Equal(t, StateOpen, e.State(SignalTraces))
	e.Observe(invalidHigh(0.5, 0.5))
	assert.Equal(t, StateNormal, e.State(SignalTraces), "never blocks Open->Normal")
	assert.Zero(t, freed, "no memory relief on an invalid level")

	t.Run("NaN counts as invalid", func(t *testing.T) {
		nan := math.NaN()
		e := New(withRelief(testConfig(1, 1), func() { freed++ }), Options{})
		e.Observe(lv(&sampler.WaterLevel{CPUSlow: nan, CPUFast: nan, CPUValid: true, Mem: nan, MemValid: true}))
		assert.Equal(t, StateNormal, e.State(SignalTraces))
		e.Observe(cpuEnter.level())
		require.Equal(t, StateShedding, e.State(SignalTraces))
		e.Observe(lv(&sampler.WaterLevel{CPUSlow: 0.5, CPUFast: 0.5, CPUValid: true, Mem: nan, MemValid: true}))
		assert.Equal(t, StateNormal, e.State(SignalTraces))
		assert.Zero(t, freed)
	})
}

func TestDisabledSlot(t *testing.T) {
	cfg := testConfig(1, 1)
	cfg.Slots[memSlot].Enabled = false
	freed := 0
	e := New(withRelief(cfg, func() { freed++ }), Options{})
	assert.Equal(t, "NN", feed(e, frame{0.5, 0.5, 0.88}, frame{0.5, 0.5, 0.99}), "never triggers")
	assert.Zero(t, freed)

	assert.Equal(t, "SN", feed(e, frame{0.85, 0.85, 0.99}, frame{0.5, 0.5, 0.99}), "never blocks exit")
	assert.Equal(t, "ON", feed(e, frame{0.5, 0.95, 0.99}, frame{0.5, 0.5, 0.99}), "never blocks Open exit")

	cfg.Slots[cpuSlot].Enabled = false
	cfg.Slots[memSlot].Enabled = false
	e = New(cfg, Options{})
	assert.Equal(t, "NNN", feed(e, frame{2, 2, 2}, frame{2, 2, 2}, frame{2, 2, 2}), "both disabled")
}

func TestOpenExitDecidedOnCurrentFrame(t *testing.T) {
	// cpu breach_n 3: the last of the three clearing frames decides.
	tests := []struct {
		name string
		tail []frame
		want State
	}{
		{"above exit before, at or below exit now", []frame{cpuResid, cpuResid, cpuOnly(0.70, 0.70)}, StateNormal},
		{"below exit before, above exit now", []frame{cpuCalm, cpuCalm, cpuOnly(0.71, 0.71)}, StateShedding},
		{"mem above exit now only", []frame{cpuCalm, cpuCalm, {0.5, 0.5, 0.79}}, StateShedding},
		{"mem above exit before only", []frame{{0.5, 0.5, 0.85}, {0.5, 0.5, 0.85}, {0.5, 0.5, 0.78}}, StateNormal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := New(testConfig(3, 1), Options{})
			require.Equal(t, "NNO", feed(e, repeat(cpuHard, 3)...))
			require.Equal(t, "OO", feed(e, tt.tail[:2]...))
			feed(e, tt.tail[2])
			assert.Equal(t, tt.want, e.State(SignalTraces))
		})
	}
}

// TestDropProbability covers p_drop = drop_min + (drop_max - drop_min) * t
// with t the larger of the memory severity (proportional)
// and the CPU share (integral, see TestCPUShare). The memory rows use
// linesConfig's memory lines: enter 0.85, hard 0.92.
func TestDropProbability(t *testing.T) {
	const step = shareGain * 0.25 // per frame at the default 250ms
	tests := []struct {
		name   string
		rule   Rule
		frames []frame // from Normal; the state after the last is Shedding
		want   float64
	}{
		{"midway mem", Rule{Enabled: true, DropMax: 1}, []frame{memOnly(0.885)}, 0.5},
		{"quarter mem", Rule{Enabled: true, DropMax: 1}, []frame{memOnly(0.86), memOnly(0.8675)}, 0.25},
		{"drop_min and drop_max", Rule{Enabled: true, DropMin: 0.2, DropMax: 0.6}, []frame{memOnly(0.885)}, 0.4},
		{"clamped at 0 below enter", Rule{Enabled: true, DropMin: 0.1, DropMax: 0.6}, []frame{memOnly(0.86), memOnly(0.80)}, 0.1},
		{"max over slots: mem", Rule{Enabled: true, DropMax: 1}, []frame{{0.85, 0.85, 0.885}}, 0.5},
		{"max over slots: cpu", Rule{Enabled: true, DropMax: 1}, repeat(frame{0.85, 0.88, 0.851}, 10), 10 * step * 0.08},
		{"invalid mem ignored", Rule{Enabled: true, DropMax: 1}, []frame{{0.85, 0.85, -1}, {0.825, 0.825, -1}}, step*0.05 + step*0.025},
		{"drop_max 0", Rule{Enabled: true, DropMax: 0}, []frame{memOnly(0.91)}, 0},
		{"rule disabled", Rule{Enabled: false, DropMax: 1}, []frame{memOnly(0.91)}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(1, 1)
			cfg.Rules[SignalLogs] = tt.rule
			var draw float64
			e := New(cfg, Options{Rand: func() float64 { return draw }})
			for _, f := range tt.frames {
				e.Observe(f.level())
			}
			require.Equal(t, StateShedding, e.State(SignalLogs))

			p := e.Stat().Signals[SignalLogs].DropProbability
			assert.InDelta(t, tt.want, p, 1e-9)

			// The draw decides: under p rejects, at or over p admits.
			if tt.want > 0 {
				draw = tt.want - 1e-6
				assert.Equal(t, VerdictDenyShed, e.Decide(SignalLogs))
			}
			draw = tt.want + 1e-6
			assert.Equal(t, VerdictAdmit, e.Decide(SignalLogs))
			draw = 0
			if tt.want == 0 {
				assert.Equal(t, VerdictAdmit, e.Decide(SignalLogs), "p 0 never rejects")
			}
		})
	}
}

// TestCPUShare covers the CPU controller: in Shedding every new CPU frame
// moves the share by gain*interval*(cpu_fast - enter), clamped to [0, 1].
func TestCPUShare(t *testing.T) {
	p := func(e *Engine) float64 { return e.Stat().Signals[SignalTraces].DropProbability }
	carried := func(f frame) *sampler.WaterLevel {
		wl := f.level()
		wl.CPUCarried = true
		return lv(wl)
	}

	t.Run("integrates the error above and below enter", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		require.Equal(t, "S", feed(e, cpuOnly(0.85, 0.88)))
		assert.InDelta(t, 0.02, p(e), 1e-9, "0.25 x 0.08")
		feed(e, repeat(cpuOnly(0.85, 0.88), 3)...)
		assert.InDelta(t, 0.08, p(e), 1e-9, "still rising while CPU is over enter")
		feed(e, cpuOnly(0.85, 0.80))
		assert.InDelta(t, 0.08, p(e), 1e-9, "at enter it holds")
		feed(e, cpuOnly(0.78, 0.76))
		assert.InDelta(t, 0.07, p(e), 1e-9, "below enter it falls")
		require.Equal(t, "SS", feed(e, repeat(cpuOnly(0.75, 0.50), 2)...))
		assert.Equal(t, 0.0, p(e), "clamped at 0, still Shedding in the band")
	})

	t.Run("clamped at 1, then mapped into the rule", func(t *testing.T) {
		cfg := testConfig(1, 1)
		cfg.Slots[cpuSlot].Hard = 5 // never Open
		cfg.Rules[SignalTraces] = Rule{Enabled: true, DropMin: 0.05, DropMax: 0.2}
		e := New(cfg, Options{})
		feed(e, repeat(cpuOnly(1.2, 1.2), 20)...) // +0.1 a frame
		assert.InDelta(t, 0.2, p(e), 1e-9, "share 1 is drop_max")
	})

	t.Run("the step scales with the interval", func(t *testing.T) {
		cfg := testConfig(1, 1)
		cfg.Interval = time.Second
		e := New(cfg, Options{})
		feed(e, cpuOnly(0.85, 0.88))
		assert.InDelta(t, 0.08, p(e), 1e-9, "1.0/s x 1s x 0.08")
		cfg.Interval = 0
		e = New(cfg, Options{})
		feed(e, cpuOnly(0.85, 0.88))
		assert.InDelta(t, 0.02, p(e), 1e-9, "0 means 250ms")
	})

	t.Run("a carried frame is not integrated twice", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		feed(e, cpuOnly(0.85, 0.88))
		e.Observe(carried(cpuOnly(0.85, 0.88)))
		e.Observe(carried(cpuOnly(0.85, 0.88)))
		assert.InDelta(t, 0.02, p(e), 1e-9)
	})

	t.Run("kept through Open, raised when CPU opened it", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		feed(e, repeat(cpuOnly(0.85, 0.88), 4)...)
		require.InDelta(t, 0.08, p(e), 1e-9)
		require.Equal(t, "OO", feed(e, cpuOnly(0.85, 0.95), cpuOnly(0.85, 0.99)))
		assert.Equal(t, 1.0, p(e), "Open")
		require.Equal(t, "S", feed(e, cpuOnly(0.85, 0.80)))
		assert.InDelta(t, 0.18, p(e), 1e-9, "0.08 + 0.1 on opening; at enter it holds")
	})

	t.Run("not raised when memory opened it", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		feed(e, repeat(frame{0.85, 0.88, 0.5}, 4)...)
		require.Equal(t, "O", feed(e, frame{0.85, 0.80, 0.95}))
		require.Equal(t, "S", feed(e, frame{0.85, 0.80, 0.5}))
		assert.InDelta(t, 0.08, p(e), 1e-9)
	})

	t.Run("unlearnt in Normal", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		feed(e, repeat(cpuOnly(0.85, 0.88), 4)...)
		require.InDelta(t, 0.08, p(e), 1e-9)
		require.Equal(t, "N", feed(e, cpuOnly(0.5, 0.78)))
		assert.Zero(t, p(e), "Normal publishes no drop")
		require.Equal(t, "S", feed(e, cpuOnly(0.85, 0.80)))
		assert.InDelta(t, 0.055, p(e), 1e-9, "0.08 - 0.25 x 0.1 (the floor of the decay), then held at enter")
		require.Equal(t, "NN", feed(e, cpuOnly(0.5, 0.5), cpuOnly(0.5, 0.5)))
		require.Equal(t, "S", feed(e, cpuOnly(0.85, 0.80)))
		assert.Zero(t, p(e), "0.055 - 0.075: gone, clamped at 0")
	})

	t.Run("kept over a failed CPU read", func(t *testing.T) {
		e := New(testConfig(1, 1), Options{})
		feed(e, repeat(cpuOnly(0.85, 0.88), 4)...)
		require.Equal(t, "N", feed(e, frame{-1, -1, -1}), "an invalid slot counts as safe")
		require.Equal(t, "S", feed(e, cpuOnly(0.85, 0.80)))
		assert.InDelta(t, 0.08, p(e), 1e-9, "the share survived the gap")
	})

	t.Run("kept through the stale fallback", func(t *testing.T) {
		clock := newClock()
		e := New(testConfig(1, 1), Options{Now: clock.Now})
		feed(e, repeat(cpuOnly(0.85, 0.88), 4)...)
		clock.Advance(time.Minute)
		require.True(t, e.Expire(time.Second))
		assert.Zero(t, p(e), "the fallback admits")
		require.Equal(t, "S", feed(e, cpuOnly(0.85, 0.80)))
		assert.InDelta(t, 0.08, p(e), 1e-9, "the state and the share are kept, as the state machine is")
	})

	t.Run("none with the CPU slot disabled", func(t *testing.T) {
		cfg := testConfig(1, 1)
		cfg.Slots[cpuSlot].Enabled = false
		e := New(cfg, Options{})
		require.Equal(t, "S", feed(e, frame{0.99, 0.99, 0.86}))
		assert.InDelta(t, 1.0/7, p(e), 1e-9, "the memory severity only")
	})
}

// runCPUModel runs cfg in closed loop against a model of a collector
// offered twice what its CPU quota can serve: CPU used is the admitted
// share of the load plus a cost per rejection, clipped at the quota, with
// ±0.1 of noise per 250 ms window (what CFS windows of a loaded collector
// show), fed through the sampler's EWMAs. It returns the mean CPU used once
// settled (after 40 s of 2 minutes), the final drop probability and the
// number of frames in Open; every settled frame must be Shedding.
func runCPUModel(t *testing.T, cfg Config) (meanCPU, pDrop float64, opens int) {
	t.Helper()
	const (
		offered    = 2.0  // cores of work offered
		rejectCost = 0.15 // cores per core of rejected work
		frames     = 480  // 2 minutes of 250 ms frames
		settled    = 160  // after 40 s
	)
	e := New(cfg, Options{Now: newClock().Now})
	noise := uint64(12345)
	var fast, slow, sumCPU float64
	for i := range frames {
		p := e.Stat().Signals[SignalTraces].DropProbability
		used := offered*(1-p) + rejectCost*offered*p
		// xorshift: deterministic noise in [-0.1, 0.1)
		noise ^= noise << 13
		noise ^= noise >> 7
		noise ^= noise << 17
		cpu := min(used, 1) + (float64(noise%2000)/10000 - 0.1)
		if i == 0 {
			fast, slow = cpu, cpu
		}
		fast = 0.7*fast + 0.3*cpu
		slow = 0.95*slow + 0.05*cpu
		e.Observe(lv(&sampler.WaterLevel{CPU: cpu, CPUFast: fast, CPUSlow: slow, CPUValid: true}))
		if e.State(SignalTraces) == StateOpen {
			opens++
		}
		if i >= settled {
			require.Equal(t, StateShedding, e.State(SignalTraces), "frame %d: settled shedding", i)
			sumCPU += min(used, 1)
		}
	}
	return sumCPU / (frames - settled), e.Stat().Signals[SignalTraces].DropProbability, opens
}

// TestCPUHeldAtEnter: without a cap on what CPU sheds, the integral
// controller holds CPU at the enter line, not at the quota, never opens,
// and sheds the share the overload needs.
func TestCPUHeldAtEnter(t *testing.T) {
	cfg := defaultConfig()
	cfg.Slots[cpuSlot].MaxShed = 1
	mean, p, opens := runCPUModel(t, cfg)
	assert.Zero(t, opens, "no Open episode")
	assert.InDelta(t, cfg.Slots[cpuSlot].Enter, mean, 0.02, "CPU held at enter, not at the quota")
	// CPU at enter: 2(1-p) + 0.3p = 0.9 -> p = 1.1/1.7.
	assert.InDelta(t, 1.1/1.7, p, 0.05)
}

// TestCPUShedCapped: with the defaults CPU alone sheds at most
// its max_shed: at twice the quota the collector runs at its quota
// (the rest waits in clients and queues), never opens, and the share does
// not wind up above the cap.
func TestCPUShedCapped(t *testing.T) {
	mean, p, opens := runCPUModel(t, defaultConfig())
	assert.Zero(t, opens, "no Open episode")
	assert.InDelta(t, defaultConfig().Slots[cpuSlot].MaxShed, p, 1e-9, "shed share at the cap")
	assert.Greater(t, mean, 0.97, "CPU at the quota")

	// The cap is on CPU only: memory over its enter line still sheds more.
	e := New(defaultConfig(), Options{Now: newClock().Now})
	e.Observe(lv(&sampler.WaterLevel{CPU: 2, CPUFast: 2, CPUSlow: 2, CPUValid: true, Mem: 0.91, MemValid: true}))
	assert.Greater(t, e.Stat().Signals[SignalTraces].DropProbability, 0.5)
}

func TestDecideDrawsOnlyWhenUncertain(t *testing.T) {
	draws := 0
	cfg := testConfig(1, 1)
	cfg.Rules[SignalTraces] = Rule{Enabled: true, DropMin: 1, DropMax: 1}
	e := New(cfg, Options{Rand: func() float64 { draws++; return 0.99 }})

	assert.Equal(t, VerdictAdmit, e.Decide(SignalMetrics), "Normal")
	e.Observe(cpuEnter.level())
	assert.Equal(t, VerdictAdmit, e.Decide(SignalMetrics), "Shedding at p 0.5, draw 0.99")
	assert.Equal(t, 1, draws)
	assert.Equal(t, VerdictDenyShed, e.Decide(SignalTraces), "Shedding at p 1")
	e.Observe(cpuHard.level())
	assert.Equal(t, VerdictDenyOpen, e.Decide(SignalMetrics), "Open")
	assert.Equal(t, 1, draws)
}

// TestRuleDisabledAdmitsBelowTheMemoryBackstop: an exempt signal is
// admitted in every state, a CPU Open included, until memory is at or over
// its hard line: a flood on it must not meet the OOM killer.
func TestRuleDisabledAdmitsBelowTheMemoryBackstop(t *testing.T) {
	cfg := testConfig(1, 1)
	cfg.Rules[SignalMetrics] = Rule{Enabled: false, DropMax: 1}
	e := New(cfg, Options{Rand: fixedRand(0)})
	e.Observe(cpuOnly(0.95, 0.95).level())
	require.Equal(t, StateOpen, e.State(SignalMetrics), "the state still follows the water level")
	assert.Equal(t, VerdictAdmit, e.Decide(SignalMetrics), "CPU Open")
	assert.Equal(t, VerdictDenyOpen, e.Decide(SignalTraces))
	assert.Zero(t, e.Stat().Signals[SignalMetrics].DropProbability)

	e.Observe(memOnly(0.90).level())
	require.Equal(t, StateShedding, e.State(SignalMetrics))
	assert.Equal(t, VerdictAdmit, e.Decide(SignalMetrics))
	assert.Equal(t, VerdictDenyShed, e.Decide(SignalTraces))

	e.Observe(memOnly(0.99).level())
	require.Equal(t, StateOpen, e.State(SignalMetrics))
	assert.Equal(t, VerdictDenyOpen, e.Decide(SignalMetrics), "memory at its hard line: the backstop")
	assert.Equal(t, 1.0, e.Stat().Signals[SignalMetrics].DropProbability)

	e.Observe(memOnly(0.89).level())
	assert.Equal(t, VerdictAdmit, e.Decide(SignalMetrics), "under the hard line again")
}

// TestExemptRampsAtTheEntranceOnly: after a memory Open the receivers'
// entrance (Pressure) ramps an exempt signal up again like the others, so
// that the exempt requests held during the Open do not all go in on the
// first frame after the relief's GC; the processor (Decide) admits it, since
// what reaches the processor is decoded already. A CPU Open starts no ramp.
func TestExemptRampsAtTheEntranceOnly(t *testing.T) {
	cfg := testConfig(1, 1)
	cfg.RecoveryRamp = 5 * time.Second
	cfg.Rules[SignalMetrics] = Rule{Enabled: false, DropMax: 1}
	clock := newClock()
	e := New(cfg, Options{Now: clock.Now, Rand: fixedRand(0)})

	e.Observe(cpuOnly(0.95, 0.95).level())
	require.Equal(t, StateOpen, e.State(SignalMetrics))
	clock.Advance(time.Second)
	e.Observe(cpuOnly(0.5, 0.5).level())
	require.Equal(t, StateNormal, e.State(SignalMetrics))
	open, p := e.Pressure(SignalMetrics)
	assert.False(t, open)
	assert.Zero(t, p, "no ramp after a CPU Open")

	e.Observe(memOnly(0.99).level())
	open, _ = e.Pressure(SignalMetrics)
	require.True(t, open, "the backstop")
	clock.Advance(time.Second)
	e.Observe(memOnly(0.22).level()) // the reading right after the relief's GC
	require.Equal(t, StateNormal, e.State(SignalMetrics))
	open, p = e.Pressure(SignalMetrics)
	assert.False(t, open)
	assert.InDelta(t, 1.0, p, 1e-9, "the entrance ramps up from 1")
	assert.Equal(t, VerdictAdmit, e.Decide(SignalMetrics), "the processor admits")
	assert.Equal(t, VerdictDenyShed, e.Decide(SignalTraces), "the others ramp everywhere")

	clock.Advance(2500 * time.Millisecond)
	e.Observe(memOnly(0.22).level())
	_, p = e.Pressure(SignalMetrics)
	assert.InDelta(t, 0.5, p, 1e-9)
	clock.Advance(2500 * time.Millisecond)
	e.Observe(memOnly(0.22).level())
	_, p = e.Pressure(SignalMetrics)
	assert.Zero(t, p, "the ramp is over")

	// CPU holds the Open the backstop began after memory is back under its
	// line: the exempt signal is refused at the entrance until the ramp.
	e.Observe(frame{0.95, 0.95, 0.99}.level())
	require.Equal(t, StateOpen, e.State(SignalMetrics))
	e.Observe(frame{0.95, 0.95, 0.22}.level())
	require.Equal(t, StateOpen, e.State(SignalMetrics), "CPU holds the Open")
	open, p = e.Pressure(SignalMetrics)
	assert.False(t, open, "under the backstop")
	assert.InDelta(t, 1.0, p, 1e-9, "refused at the entrance for the rest of the Open")
	assert.Equal(t, VerdictAdmit, e.Decide(SignalMetrics), "the processor admits")
	clock.Advance(time.Second)
	e.Observe(frame{0.5, 0.5, 0.22}.level())
	require.Equal(t, StateNormal, e.State(SignalMetrics))
	_, p = e.Pressure(SignalMetrics)
	assert.InDelta(t, 1.0, p, 1e-9, "then the ramp")
}

// TestExemptNotRampedWithoutRamp: with the ramp off, an exempt signal is
// refused at the backstop only, even while another resource holds the Open
// memory began.
func TestExemptNotRampedWithoutRamp(t *testing.T) {
	cfg := testConfig(1, 1)
	cfg.RecoveryRamp = 0
	cfg.Rules[SignalMetrics] = Rule{Enabled: false, DropMax: 1}
	e := New(cfg, Options{Rand: fixedRand(0)})
	e.Observe(frame{0.95, 0.95, 0.99}.level())
	e.Observe(frame{0.95, 0.95, 0.22}.level())
	require.Equal(t, StateOpen, e.State(SignalMetrics))
	open, p := e.Pressure(SignalMetrics)
	assert.False(t, open)
	assert.Zero(t, p)
}

func TestDropMaxZeroShedsNothingButOpens(t *testing.T) {
	cfg := testConfig(1, 1)
	cfg.RecoveryRamp = 5 * time.Second
	cfg.Rules[SignalMetrics] = Rule{Enabled: true, DropMax: 0}
	clock := newClock()
	e := New(cfg, Options{Rand: fixedRand(0), Now: clock.Now})

	e.Observe(memOnly(0.91).level())
	require.Equal(t, StateShedding, e.State(SignalMetrics))
	assert.Equal(t, VerdictAdmit, e.Decide(SignalMetrics), "exempt from shedding")
	assert.Equal(t, VerdictDenyShed, e.Decide(SignalTraces))

	e.Observe(memOnly(0.93).level())
	require.Equal(t, StateOpen, e.State(SignalMetrics))
	assert.Equal(t, VerdictDenyOpen, e.Decide(SignalMetrics), "not exempt from Open")
	assert.Equal(t, 1.0, e.Stat().Signals[SignalMetrics].DropProbability)

	clock.Advance(time.Second)
	e.Observe(memOnly(0.5).level())
	require.Equal(t, StateNormal, e.State(SignalMetrics))
	assert.Equal(t, VerdictDenyShed, e.Decide(SignalMetrics), "not exempt from the ramp after a memory Open")
	assert.Equal(t, VerdictDenyShed, e.Decide(SignalTraces), "others ramp")
}

func TestRecoveryRamp(t *testing.T) {
	cfg := testConfig(1, 1)
	cfg.RecoveryRamp = 5 * time.Second
	cfg.Rules[SignalTraces] = Rule{Enabled: true, DropMax: 1}
	cfg.Rules[SignalMetrics] = Rule{Enabled: true, DropMin: 0, DropMax: 0.2} // the ramp is not capped by drop_max
	cfg.Rules[SignalLogs] = Rule{Enabled: false, DropMax: 1}
	cfg.Rules[SignalProfiles] = Rule{Enabled: true, DropMax: 0}

	clock := newClock()
	e := New(cfg, Options{Now: clock.Now})
	probabilities := func() [NumSignals]float64 {
		var out [NumSignals]float64
		for i, s := range e.Stat().Signals {
			out[i] = s.DropProbability
		}
		return out
	}

	e.Observe(memOnly(0.95).level())
	require.Equal(t, StateOpen, e.State(SignalTraces))
	assert.Equal(t, [NumSignals]float64{1, 1, 1, 1}, probabilities(), "logs, exempt, at the memory backstop")

	// Left to Normal: the ramp starts at 1 and falls linearly over 5s.
	clock.Advance(3 * time.Second)
	steps := []struct {
		after time.Duration
		mem   float64
		state State
		ramp  float64
	}{
		{0, 0.50, StateNormal, 1},
		{time.Second, 0.50, StateNormal, 0.8},
		{1500 * time.Millisecond, 0.50, StateNormal, 0.5},
		// In Shedding the larger of the ramp and p_drop holds.
		{500 * time.Millisecond, 0.885, StateShedding, 0.4}, // t = 0.5: traces 0.5, metrics 0.1
		{time.Second, 0.885, StateShedding, 0.2},
		{time.Second, 0.50, StateNormal, 0},
		{time.Second, 0.50, StateNormal, 0},
	}
	for i, st := range steps {
		clock.Advance(st.after)
		e.Observe(memOnly(st.mem).level())
		require.Equal(t, st.state, e.State(SignalTraces), "step %d", i)
		p := probabilities()
		shed := 0.0
		if st.state == StateShedding {
			shed = 0.5
		}
		assert.InDelta(t, max(st.ramp, shed), p[SignalTraces], 1e-9, "traces step %d", i)
		assert.InDelta(t, max(st.ramp, shed*0.2), p[SignalMetrics], 1e-9, "metrics step %d", i)
		assert.InDelta(t, st.ramp, p[SignalLogs], 1e-9, "logs (exempt) ramp only, at the entrance, step %d", i)
		assert.InDelta(t, st.ramp, p[SignalProfiles], 1e-9, "profiles (drop_max 0) ramp only, step %d", i)
	}

	t.Run("decided with the ramp", func(t *testing.T) {
		clock := newClock()
		var draw float64
		e := New(cfg, Options{Now: clock.Now, Rand: func() float64 { return draw }})
		e.Observe(memOnly(0.95).level())
		clock.Advance(time.Second)
		e.Observe(memOnly(0.5).level())
		assert.Equal(t, VerdictDenyShed, e.Decide(SignalTraces), "p 1 right after Open")
		clock.Advance(time.Second)
		e.Observe(memOnly(0.5).level())
		draw = 0.79
		assert.Equal(t, VerdictDenyShed, e.Decide(SignalTraces))
		draw = 0.81
		assert.Equal(t, VerdictAdmit, e.Decide(SignalTraces))
	})

	t.Run("restarts after another Open", func(t *testing.T) {
		clock := newClock()
		e := New(cfg, Options{Now: clock.Now})
		e.Observe(memOnly(0.95).level())
		e.Observe(memOnly(0.5).level())
		clock.Advance(4 * time.Second)
		e.Observe(memOnly(0.95).level())
		clock.Advance(time.Second)
		e.Observe(memOnly(0.5).level())
		assert.Equal(t, 1.0, e.Stat().Signals[SignalTraces].DropProbability)
	})

	t.Run("zero disables it", func(t *testing.T) {
		cfg := testConfig(1, 1)
		e := New(cfg, Options{Now: newClock().Now})
		e.Observe(memOnly(0.95).level())
		e.Observe(memOnly(0.5).level())
		assert.Zero(t, e.Stat().Signals[SignalTraces].DropProbability)
	})
}

func TestMemoryRelief(t *testing.T) {
	clock := newClock()
	var freedAt []time.Duration
	start := clock.Now()
	cfg := testConfig(1, 1)
	e := New(withRelief(cfg, func() { freedAt = append(freedAt, clock.Now().Sub(start)) }), Options{Now: clock.Now})

	tick := func(f frame) {
		e.Observe(f.level())
		clock.Advance(250 * time.Millisecond)
	}
	ms := func(n ...int) (d []time.Duration) {
		for _, v := range n {
			d = append(d, time.Duration(v)*time.Millisecond)
		}
		return d
	}
	for range 4 { // 0s .. 0.75s at the hard line: every frame, the relief decides
		tick(memOnly(0.92))
	}
	assert.Equal(t, ms(0, 250, 500, 750), freedAt)

	freedAt = nil
	tick(memOnly(0.91)) // 1s: under hard, no call
	tick(memOnly(0.99)) // 1.25s: over again
	assert.Equal(t, ms(1250), freedAt)

	freedAt = nil
	for range 8 {
		tick(frame{0.99, 0.99, 0.5}) // cpu over hard: not a memory problem
	}
	assert.Empty(t, freedAt)

	cfg.Slots[memSlot].Enabled = false
	e = New(withRelief(cfg, func() { freedAt = append(freedAt, 0) }), Options{Now: clock.Now})
	tick(memOnly(0.99))
	assert.Empty(t, freedAt, "disabled slot")
}

// TestBurstReplay replays a realistic burst with the default thresholds: CPU
// rises (fast leading slow), memory follows, both plateau above hard, then
// the load falls away.
func TestBurstReplay(t *testing.T) {
	frames := []struct {
		f    frame
		want State
	}{
		{frame{0.40, 0.45, 0.50}, StateNormal},
		{frame{0.55, 0.70, 0.55}, StateNormal},
		{frame{0.70, 0.85, 0.60}, StateNormal},
		{frame{0.81, 0.92, 0.66}, StateNormal}, // enter and hard streaks at 1
		{frame{0.84, 0.95, 0.72}, StateNormal}, // 2
		{frame{0.87, 0.97, 0.80}, StateOpen},   // 3: Open wins over Shedding
		{frame{0.90, 0.98, 0.88}, StateOpen},   // plateau
		{frame{0.92, 0.97, 0.93}, StateOpen},   // memory at hard too
		{frame{0.93, 0.96, 0.90}, StateOpen},
		{frame{0.92, 0.85, 0.84}, StateOpen}, // under hard: 1
		{frame{0.90, 0.80, 0.80}, StateOpen}, // 2
		{frame{0.87, 0.78, 0.75}, StateShedding},
		{frame{0.84, 0.72, 0.70}, StateShedding},
		{frame{0.78, 0.62, 0.66}, StateShedding},
		{frame{0.72, 0.55, 0.62}, StateShedding},
		{frame{0.68, 0.50, 0.60}, StateShedding}, // under exit: 1
		{frame{0.64, 0.48, 0.58}, StateShedding}, // 2
		{frame{0.60, 0.45, 0.55}, StateNormal},
		{frame{0.55, 0.42, 0.52}, StateNormal},
	}
	var transitions []Transition
	cfg := linesConfig()
	e := New(cfg, Options{
		Now:          newClock().Now,
		OnTransition: func(tr Transition) { transitions = append(transitions, tr) },
	})
	var got, want []State
	for _, fr := range frames {
		e.Observe(fr.f.level())
		got = append(got, e.State(SignalTraces))
		want = append(want, fr.want)
	}
	assert.Equal(t, want, got)

	// Each change is reported once per signal, with the level that caused it.
	require.Len(t, transitions, 3*int(NumSignals))
	for i, step := range []struct {
		from, to State
		cpuSlow  float64
	}{{StateNormal, StateOpen, 0.87}, {StateOpen, StateShedding, 0.87}, {StateShedding, StateNormal, 0.60}} {
		for s := range NumSignals {
			tr := transitions[i*int(NumSignals)+int(s)]
			assert.Equal(t, s, tr.Signal)
			assert.Equal(t, step.from, tr.From)
			assert.Equal(t, step.to, tr.To)
			assert.Equal(t, step.cpuSlow, tr.Level.CPUSlow)
		}
	}
}

// TestSheddingRejectsPDropOfDraws checks the real random source: the number
// of rejections out of n is binomial(n, p); 5 sigma makes a false failure
// about a one-in-a-million event.
func TestSheddingRejectsPDropOfDraws(t *testing.T) {
	e := New(testConfig(1, 1), Options{})
	e.Observe(memOnly(0.871).level())
	p := e.Stat().Signals[SignalTraces].DropProbability
	require.InDelta(t, 0.3, p, 1e-9)

	const n = 200_000
	rejected := 0
	for range n {
		if e.Decide(SignalTraces) == VerdictDenyShed {
			rejected++
		}
	}
	mean := n * p
	sigma := math.Sqrt(n * p * (1 - p))
	assert.InDelta(t, mean, float64(rejected), 5*sigma, "rejected %d of %d at p %.2f", rejected, n, p)
}

func TestStat(t *testing.T) {
	e := New(testConfig(1, 1), Options{})
	st := e.Stat()
	for _, s := range st.Signals {
		assert.Equal(t, SignalStat{State: StateNormal}, s)
	}
	assert.False(t, st.Level.CPUValid)

	wl := frame{0.5, 0.6, 0.885}.level()
	e.Observe(wl)
	st = e.Stat()
	assert.Equal(t, *wl, st.Level)
	assert.Equal(t, StateShedding, st.Signals[SignalProfiles].State)
	assert.InDelta(t, 0.5, st.Signals[SignalProfiles].DropProbability, 1e-9)
}

func TestBadInput(t *testing.T) {
	e := New(testConfig(1, 1), Options{})
	e.Observe(nil)
	assert.Equal(t, StateNormal, e.State(SignalTraces))
	assert.Equal(t, VerdictAdmit, e.Decide(NumSignals))
	assert.Equal(t, VerdictAdmit, e.Decide(Signal(200)))
	assert.Equal(t, StateNormal, e.State(Signal(200)))

	// hard <= enter (rejected by config validation) must not divide by
	// zero in the memory severity.
	cfg := testConfig(0, 0) // breach_n 0 counts as 1
	m := &cfg.Slots[memSlot]
	m.Enter, m.Exit, m.Hard, m.BreachN = 0.9, 0.5, 0.9, 0
	cfg.RecoveryRamp = -time.Second
	e = New(cfg, Options{})
	assert.Equal(t, "S", feed(e, frame{0.85, 0.80, 0.89}))
	assert.Equal(t, 0.0, e.Stat().Signals[SignalTraces].DropProbability)
	cfg.Slots[memSlot].Enter = 0.95 // enter > hard: memory over enter counts as severity 1
	e = New(cfg, Options{})
	assert.Equal(t, "S", feed(e, frame{0.85, 0.80, 0.5}))
	assert.Equal(t, "O", feed(e, frame{0.85, 0.80, 0.96}))
	assert.Equal(t, 1.0, e.Stat().Signals[SignalTraces].DropProbability)

	// Out-of-range rules are clamped.
	cfg = testConfig(1, 1)
	cfg.Rules[SignalTraces] = Rule{Enabled: true, DropMin: -1, DropMax: 3}
	e = New(cfg, Options{})
	feed(e, memOnly(0.91))
	assert.Equal(t, 1.0, e.Stat().Signals[SignalTraces].DropProbability)
}

func TestConcurrentDecideAndObserve(*testing.T) {
	e := New(linesConfig(), Options{})
	levels := []frame{calm, cpuEnter, cpuEnterHd, memOnly(0.95), calm}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				for s := range NumSignals {
					_ = e.Decide(s)
					_ = e.State(s)
				}
				_ = e.Stat()
			}
		})
	}
	for i := range 2000 {
		e.Observe(levels[i%len(levels)].level())
	}
	close(stop)
	wg.Wait()
}

// engineIn returns an engine whose signals are all in state, Shedding at p 0.5.
func engineIn(tb testing.TB, state State) *Engine {
	e := New(testConfig(1, 1), Options{})
	switch state {
	case StateShedding:
		e.Observe(memOnly(0.885).level())
	case StateOpen:
		e.Observe(memOnly(0.95).level())
	}
	require.Equal(tb, state, e.State(SignalTraces))
	return e
}

var sink Verdict

func BenchmarkDecide(b *testing.B) {
	for _, state := range []State{StateNormal, StateShedding, StateOpen} {
		b.Run(state.String(), func(b *testing.B) {
			e := engineIn(b, state)
			b.ReportAllocs()
			var v Verdict
			for b.Loop() {
				v = e.Decide(SignalTraces)
			}
			sink = v
		})
	}
}

func BenchmarkDecideParallel(b *testing.B) {
	for _, state := range []State{StateNormal, StateShedding, StateOpen} {
		b.Run(state.String(), func(b *testing.B) {
			e := engineIn(b, state)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				var v Verdict
				s := SignalTraces
				for pb.Next() {
					v = e.Decide(s)
					s = (s + 1) % NumSignals
				}
				_ = v
			})
		})
	}
}

func BenchmarkObserve(b *testing.B) {
	b.Run("steady", func(b *testing.B) {
		e := New(linesConfig(), Options{Now: newClock().Now})
		wl := calm.level()
		b.ReportAllocs()
		for b.Loop() {
			e.Observe(wl)
		}
	})
	b.Run("changing", func(b *testing.B) {
		// Every frame changes p_drop: one snapshot published per signal.
		e := New(testConfig(1, 1), Options{Now: newClock().Now})
		wls := []*sampler.WaterLevel{memOnly(0.86).level(), memOnly(0.87).level()}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			e.Observe(wls[i&1])
			i++
		}
	})
}

// TestRecoveryRampFollowsMemoryOpenOnly: the ramp exists because memory can
// jump from below the exit line to the OOM killer within one interval; a
// CPU-only Open is left without it, so shedding resumes at p_drop at once.
func TestRecoveryRampFollowsMemoryOpenOnly(t *testing.T) {
	for _, tc := range []struct {
		name     string
		open     frame
		wantRamp float64
	}{
		{"cpu only", cpuOnly(0.95, 0.95), 0},
		{"memory", memOnly(0.95), 1},
		{"both", frame{0.95, 0.95, 0.95}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(1, 1)
			cfg.RecoveryRamp = 5 * time.Second
			clock := newClock()
			e := New(cfg, Options{Now: clock.Now})
			e.Observe(tc.open.level())
			require.Equal(t, StateOpen, e.State(SignalTraces))
			clock.Advance(time.Second)
			e.Observe(frame{0.5, 0.5, 0.5}.level())
			require.Equal(t, StateNormal, e.State(SignalTraces))
			assert.InDelta(t, tc.wantRamp, e.Stat().Signals[SignalTraces].DropProbability, 1e-9)
		})
	}
	// A memory Open entered through CPU still ramps: memory reached its
	// hard line during the episode.
	cfg := testConfig(1, 1)
	cfg.RecoveryRamp = 5 * time.Second
	clock := newClock()
	e := New(cfg, Options{Now: clock.Now})
	e.Observe(cpuOnly(0.95, 0.95).level())
	e.Observe(frame{0.95, 0.95, 0.95}.level())
	e.Observe(frame{0.5, 0.5, 0.5}.level())
	require.Equal(t, StateNormal, e.State(SignalTraces))
	assert.InDelta(t, 1, e.Stat().Signals[SignalTraces].DropProbability, 1e-9)
}

// TestCarriedCPUFramesDoNotCount: a frame whose CPU window was skipped
// repeats the last reading; it must not advance a breach_n streak, or one
// measurement over the hard line followed by two skipped frames would Open.
func TestCarriedCPUFramesDoNotCount(t *testing.T) {
	e := New(testConfig(3, 1), Options{Now: newClock().Now})
	carried := func(f frame) *sampler.WaterLevel {
		wl := f.level()
		wl.CPUCarried = true
		return lv(wl)
	}
	hot := cpuOnly(0.95, 0.95)
	e.Observe(hot.level())
	e.Observe(carried(hot))
	e.Observe(carried(hot))
	assert.Equal(t, StateNormal, e.State(SignalTraces), "one measurement, two repeats")
	e.Observe(hot.level())
	e.Observe(hot.level())
	assert.Equal(t, StateOpen, e.State(SignalTraces), "three measurements")
}

// TestHoldForBoundsThePressure: a refusal may be held until the pressure of
// a slot with HoldFor has lasted that long, and again once its level is
// back under exit and a new pressure starts; a slot without HoldFor that
// presses too keeps the hold.
func TestHoldForBoundsThePressure(t *testing.T) {
	cfg := testConfig(1, 1)
	cfg.Slots[memSlot].HoldFor = 8 * time.Second
	clock := newClock()
	e := New(cfg, Options{Now: clock.Now})
	holdable := func() bool {
		t.Helper()
		h := e.Holdable(SignalTraces)
		for s := range NumSignals {
			require.Equal(t, h, e.Holdable(s), "every signal alike")
		}
		return h
	}
	assert.True(t, holdable(), "before any frame")
	steps := []struct {
		after time.Duration
		f     frame
		state State
		hold  bool
	}{
		{0, calm, StateNormal, true},
		{0, memOnly(0.88), StateShedding, true}, // the pressure starts
		{5 * time.Second, memOnly(0.88), StateShedding, true},
		{3 * time.Second, memOnly(0.88), StateShedding, false},       // 8 s: outlasted
		{time.Second, memOnly(0.95), StateOpen, false},               // the same pressure, worse
		{time.Second, memOnly(0.80), StateShedding, false},           // under hard, above exit: still pressing
		{time.Second, frame{0.85, 0.85, 0.80}, StateShedding, true},  // CPU presses too, without HoldFor
		{time.Second, frame{0.50, 0.50, 0.80}, StateShedding, false}, // CPU calm again
		{time.Second, memOnly(0.50), StateNormal, true},              // under exit: over
		{time.Second, memOnly(0.88), StateShedding, true},            // a new pressure
		{7 * time.Second, memOnly(0.88), StateShedding, true},
		{time.Second, memOnly(0.88), StateShedding, false},
	}
	for i, st := range steps {
		clock.Advance(st.after)
		e.Observe(st.f.level())
		require.Equal(t, st.state, e.State(SignalTraces), "step %d", i)
		assert.Equal(t, st.hold, holdable(), "step %d", i)
	}

	t.Run("without HoldFor always", func(t *testing.T) {
		clock := newClock()
		e := New(testConfig(1, 1), Options{Now: clock.Now})
		e.Observe(memOnly(0.95).level())
		clock.Advance(time.Hour)
		e.Observe(memOnly(0.95).level())
		assert.True(t, e.Holdable(SignalTraces))
	})
}
