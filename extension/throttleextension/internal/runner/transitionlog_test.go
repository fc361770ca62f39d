// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/testutil"
)

var (
	allSignals = []decision.Signal{decision.SignalTraces, decision.SignalMetrics, decision.SignalLogs, decision.SignalProfiles}
	allStates  = []decision.State{decision.StateNormal, decision.StateShedding, decision.StateOpen}
)

// TestSamplingDropsRepeatedMessages is the premise: under the collector's
// default sampling a message logged more than 10 times in 10s loses lines.
func TestSamplingDropsRepeatedMessages(t *testing.T) {
	logger, logs, dropped := testutil.SampledLogger()
	for range 80 {
		logger.Info(testutil.TransitionMessage(decision.SignalTraces, decision.StateNormal, decision.StateOpen))
	}
	assert.Equal(t, 10, logs.Len())
	assert.Equal(t, int64(70), dropped.Load())
}

// TestTransitionLogUnderSamplingLongRun replays half an hour of a flapping
// state at random rates against the collector's sampler on a fake clock:
// nothing is ever dropped, every change is accounted for, the summaries
// come at most once per window and within one sample of the window's end.
func TestTransitionLogUnderSamplingLongRun(t *testing.T) {
	clock := testutil.NewClock(time.Unix(1_700_000_000, 0))
	logger, logs, dropped := testutil.SampledLogger(zap.WithClock(clock))
	l := newTransitionLog(logger, clock.Now, testResources())
	rng := rand.New(rand.NewPCG(1, 2))

	const interval = 250 * time.Millisecond
	var changes [decision.NumSignals]int
	state := decision.StateNormal
	end := clock.Now().Add(30 * time.Minute)
	for clock.Now().Before(end) {
		clock.Advance(interval)
		// Bursts of flapping (a change every tick) alternate with calm.
		if (clock.Now().Unix()/45)%2 == 0 || rng.IntN(20) == 0 {
			next := decision.State(rng.IntN(3))
			if next != state {
				for s := range decision.NumSignals {
					l.transition(decision.Transition{Signal: s, From: state, To: next, Level: sampler.WaterLevel{At: clock.Now()}})
					changes[s]++
				}
				state = next
			}
		}
		l.tick()
	}
	l.flush()

	assert.Zero(t, dropped.Load())
	a := testutil.CountTransitions(t, logs.All(), transitionSummaryMessage, allSignals, allStates)
	for _, s := range allSignals {
		assert.Equal(t, changes[s], a.Lines[s]+a.Summarised[s], s.String())
		assert.Equal(t, state.String(), a.Last[s], s.String())
		assert.Positive(t, a.Summarised[s], "the replay must exercise the summary")
	}
	var prev time.Time
	summaries := logs.FilterMessage(transitionSummaryMessage).All()
	require.Greater(t, len(summaries), 10)
	for _, en := range summaries[:len(summaries)-1] { // the last may be the final flush
		if !prev.IsZero() {
			assert.GreaterOrEqual(t, en.Time.Sub(prev), transitionLogWindow)
		}
		prev = en.Time
		w := en.ContextMap()["window"].(time.Duration)
		assert.GreaterOrEqual(t, w, transitionLogWindow)
		assert.Less(t, w, transitionLogWindow+interval)
	}
}

// TestLogMessagesHaveDistinctSamplerKeys: zap's sampler counts entries per
// level in 4096 buckets keyed by fnv32a(message). Two of our messages in one
// bucket would share one allowance of 10 and lose lines; check they do not.
func TestLogMessagesHaveDistinctSamplerKeys(t *testing.T) {
	fnv32a := func(s string) uint32 { // as in zapcore/sampler.go
		h := uint32(2166136261)
		for i := 0; i < len(s); i++ {
			h ^= uint32(s[i])
			h *= 16777619
		}
		return h
	}
	info := []string{transitionSummaryMessage, "throttle started"}
	for _, s := range allSignals {
		for from := decision.StateNormal; from <= decision.StateOpen; from++ {
			for to := decision.StateNormal; to <= decision.StateOpen; to++ {
				if from != to {
					info = append(info, testutil.TransitionMessage(s, from, to))
				}
			}
		}
	}
	seen := map[uint32]string{}
	for _, m := range info {
		b := fnv32a(m) % 4096
		if other, ok := seen[b]; ok {
			t.Errorf("%q and %q share sampler bucket %d", m, other, b)
		}
		seen[b] = m
	}
	assert.Len(t, info, 26)
	assert.True(t, strings.HasPrefix(transitionSummaryMessage, "throttle: "))
}

// The reason the page gives for a change names the levels of its frame
// against the lines they crossed, for the slots that are on.
func TestTransitionReason(t *testing.T) {
	slots := testSlots() // cpu 0.90 / 0.80 / 1.10, memory 0.85 / 0.78 / 0.92
	cpu, mem := slots[0], slots[1]
	cpuOff := cpu
	cpuOff.Enabled = false
	lvl := func(slow, fast, mem float64) sampler.WaterLevel {
		return *levels(&sampler.WaterLevel{CPUValid: true, CPUSlow: slow, CPUFast: fast, MemValid: true, Mem: mem})
	}
	for _, tc := range []struct {
		from, to decision.State
		level    sampler.WaterLevel
		cpu      decision.Slot
		want     string
	}{
		{decision.StateNormal, decision.StateShedding, lvl(0.95, 0.97, 0.5), cpu, "cpu slow 95% > enter 90%"},
		{decision.StateNormal, decision.StateShedding, lvl(0.95, 0.97, 0.9234), cpu, "cpu slow 95% > enter 90%, memory 92.3% > enter 85%"},
		{decision.StateNormal, decision.StateOpen, lvl(1, 1.2, 0.93), cpu, "cpu fast 120% ≥ hard 110%, memory 93% ≥ hard 92%"},
		{decision.StateShedding, decision.StateOpen, lvl(1, 1.2, 0.93), cpuOff, "memory 93% ≥ hard 92%"},
		{decision.StateShedding, decision.StateNormal, lvl(0.7, 0.75, 0.6), cpu, "cpu slow 70% < exit 80%, memory 60% < exit 78%"},
		{
			decision.StateOpen, decision.StateShedding, lvl(0.85, 0.85, 0.8), cpu,
			"cpu fast 85% < hard 110%, memory 80% < hard 92%; cpu slow 85% > exit 80%, memory 80% > exit 78%",
		},
		{
			decision.StateOpen, decision.StateNormal, lvl(0.5, 0.6, 0.7), cpu,
			"cpu fast 60% < hard 110%, memory 70% < hard 92%; cpu slow 50% < exit 80%, memory 70% < exit 78%",
		},
		// A slot without a reading counts as safe: it lets the state
		// recover, and is not why it worsened.
		{decision.StateShedding, decision.StateNormal, *levels(&sampler.WaterLevel{CPUValid: true, CPUSlow: 0.7}), cpu, "cpu slow 70% < exit 80%, memory not measured"},
		{decision.StateNormal, decision.StateShedding, *levels(&sampler.WaterLevel{MemValid: true, Mem: 0.9}), cpu, "memory 90% > enter 85%"},
	} {
		got := transitionReason(decision.Transition{From: tc.from, To: tc.to, Level: tc.level}, testResources(), []decision.Slot{tc.cpu, mem})
		assert.Equal(t, tc.want, got, "%v -> %v", tc.from, tc.to)
	}
}
