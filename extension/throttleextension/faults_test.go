// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// Sampler faults seen from the extension: whatever the
// reader does, every failure is counted in throttle_sampler_errors under its
// resource, each resource is logged at Warn at most once per warnEvery (30s,
// so once in these tests however many ticks fail), decisions stay sane and
// nothing panics. The sampler-level outcomes (frame skipped, signal invalid)
// are in internal/sampler/faults_test.go.

// The faults the tests switch on and off, worded as the cgroup reader's.
var (
	errCPUFault    = fmt.Errorf("read cpu.stat: %w", fs.ErrNotExist)
	errMemoryFault = errors.New("parse memory.current: invalid syntax (content \"garb\")")
	errLimitsFault = errors.New("read cpu.max: is a directory")
)

// newFaultSource is a one-core source at pct percent of testMemLimit whose
// CPU counter stands at an hour, so that it can go backwards.
func newFaultSource(pct uint64) *testutil.Source {
	src := testutil.NewSource(cgroup.Limits{QuotaCores: 1, MemLimit: testMemLimit})
	src.SetMemoryShare(float64(pct) / 100)
	src.SetCPUTime(time.Hour)
	return src
}

// samplerErrors returns throttle_sampler_errors by resource.
func samplerErrors(t *testing.T, tel *componenttest.Telemetry) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	m, err := tel.GetMetric("otelcol_throttle_sampler_errors")
	if err != nil {
		return out
	}
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		r, _ := dp.Attributes.Value("resource")
		out[r.AsString()] = dp.Value
	}
	return out
}

const samplerWarn = "throttle sampler: resource read failed or frame skipped"

// samplerWarns counts the sampler's Warn lines by resource.
func samplerWarns(logs *observer.ObservedLogs) map[string]int {
	out := map[string]int{}
	for _, l := range logs.FilterLevelExact(zapcore.WarnLevel).FilterMessageSnippet(samplerWarn).All() {
		out[l.ContextMap()["resource"].(string)]++
	}
	return out
}

func faultExtension(t *testing.T, src sampler.Source) (*throttleExtension, *componenttest.Telemetry, *observer.ObservedLogs) {
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	set := metadatatest.NewSettings(tel)
	core, logs := observer.New(zapcore.InfoLevel)
	set.Logger = zap.New(core)
	e := startTestExtension(t, src, testConfig(t), set)
	return e, tel, logs
}

// TestFaultsCountedAndWarnedOnce: CPU and memory reads fail for 50 ticks.
// Every failure is counted, each resource is warned about once. An unreadable memory level counts as safe, so a
// throttle in Open falls back to Normal (fail open) rather than rejecting on
// a level it cannot read; when memory reads again it is Open again.
func TestFaultsCountedAndWarnedOnce(t *testing.T) {
	verifyNoLeaks(t)
	src := newFaultSource(95)
	e, tel, logs := faultExtension(t, src)
	waitState(t, e, decision.StateOpen)
	require.Equal(t, decision.VerdictDenyOpen, e.Decide(decision.SignalTraces))

	src.Fail(testutil.CPUTime, errCPUFault)
	src.Fail(testutil.WorkingSet, errMemoryFault)
	waitTicks(t, src, 50)
	waitState(t, e, decision.StateNormal)
	assert.Equal(t, decision.VerdictAdmit, e.Decide(decision.SignalTraces), "an unreadable level fails open")
	assert.Empty(t, levelsOnly(waterLevels(t, tel)), "neither level is valid")

	// The source counts a read before the sampler counts its failure.
	assert.EventuallyWithT(t, func(c *assert.CollectT) {
		errs := samplerErrors(t, tel)
		assert.GreaterOrEqual(c, errs["cpu"], int64(50))
		assert.GreaterOrEqual(c, errs["memory"], int64(50))
	}, 5*time.Second, time.Millisecond, "every failed read is counted")
	assert.Equal(t, map[string]int{"cpu": 1, "memory": 1}, samplerWarns(logs),
		"one Warn per resource per 30s, not one per tick")

	src.Fail(testutil.CPUTime, nil)
	src.Fail(testutil.WorkingSet, nil)
	waitState(t, e, decision.StateOpen)
	assert.Equal(t, decision.VerdictDenyOpen, e.Decide(decision.SignalTraces))
	waitTicks(t, src, 5)
	assert.Equal(t, map[string]int{"cpu": 1, "memory": 1}, samplerWarns(logs))
	require.NoError(t, e.Shutdown(context.Background()))
}

// TestFaultsLimitsUnreadableFromStart: with no limits ever read there is no
// memory limit, so the memory signal is off (invalid, safe) and the
// throttle admits; it is counted and warned once.
func TestFaultsLimitsUnreadableFromStart(t *testing.T) {
	verifyNoLeaks(t)
	src := newFaultSource(95)
	src.SetLimits(cgroup.Limits{}) // none known
	src.Fail(testutil.Limits, errLimitsFault)
	e, tel, logs := faultExtension(t, src)
	waitTicks(t, src, 10)
	assert.NotContains(t, waterLevels(t, tel), "memory", "no memory level")
	assert.Equal(t, decision.VerdictAdmit, e.Decide(decision.SignalTraces))
	assert.Equal(t, decision.StateNormal, e.State(decision.SignalTraces))
	assert.Equal(t, int64(1), samplerErrors(t, tel)["limits"], "limits are read at Start, then every 10s")
	assert.Equal(t, 1, samplerWarns(logs)["limits"])
	require.NoError(t, e.Shutdown(context.Background()))
}

// TestFaultsCounterKeepsResetting: a CPU counter that goes backwards on
// every tick skips every CPU window (counted under cpu, warned once); the
// memory level still drives the state.
func TestFaultsCounterKeepsResetting(t *testing.T) {
	verifyNoLeaks(t)
	src := newFaultSource(50)
	src.SetCPUStep(-time.Millisecond) // a counter that keeps resetting
	e, tel, logs := faultExtension(t, src)
	waitTicks(t, src, 30)
	assert.GreaterOrEqual(t, samplerErrors(t, tel)["cpu"], int64(28))
	assert.Equal(t, map[string]int{"cpu": 1}, samplerWarns(logs))
	assert.NotContains(t, waterLevels(t, tel), "cpu", "no window was ever valid")

	src.SetMemoryShare(0.95)
	waitState(t, e, decision.StateOpen)
	require.NoError(t, e.Shutdown(context.Background()))
}

// slowSource takes longer than the sample interval to read the CPU time.
type slowSource struct {
	*testutil.Source
	delay time.Duration
}

func (s *slowSource) CPUTime() (time.Duration, error) {
	time.Sleep(s.delay) // the simulated slow read, not a synchronisation
	return s.Source.CPUTime()
}

// TestFaultsSlowTicks: every read takes twice the interval. Ticks do not
// pile up (the ticker drops them), each CPU window is skipped as a slow read
// and warned about once, memory still drives the state, and Shutdown
// returns.
func TestFaultsSlowTicks(t *testing.T) {
	verifyNoLeaks(t)
	src := &slowSource{Source: newFaultSource(50), delay: 20 * time.Millisecond}
	e, tel, logs := faultExtension(t, src)
	waitTicks(t, src.Source, 10)
	assert.GreaterOrEqual(t, samplerErrors(t, tel)["cpu"], int64(9))
	assert.Equal(t, map[string]int{"cpu": 1}, samplerWarns(logs))
	warn := logs.FilterMessageSnippet(samplerWarn).All()[0]
	assert.Contains(t, warn.ContextMap()["error"], sampler.ErrSlowRead.Error())

	src.SetMemoryShare(0.95)
	waitState(t, e, decision.StateOpen)
	require.NoError(t, e.Shutdown(context.Background()))
}

// TestFaultsRealCgroupReader runs the extension on the real cgroup reader
// over a copy of a fixture tree and breaks its files while it runs: garbage,
// a partial line, a counter reset. Files are rewritten in place (the reader
// keeps them open), so a read may also catch one half-written: whatever it
// reads, it is counted and warned at most once per resource.
func TestFaultsRealCgroupReader(t *testing.T) {
	verifyNoLeaks(t)
	root := filepath.Join(t.TempDir(), "root")
	require.NoError(t, os.CopyFS(root, os.DirFS(filepath.Join("..", "..", "internal", "cgroup", "testdata", "v2-container"))))
	dir := filepath.Join(root, "sys", "fs", "cgroup")
	write := func(file, content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, file), []byte(content), 0o644))
	}
	r, err := cgroup.NewReader(root)
	require.NoError(t, err)
	t.Cleanup(func() { _ = r.Close() })

	e, tel, logs := faultExtension(t, r)
	const fixtureMem = 80.0 / 512 // working set / memory.max in the fixture
	waitLevel(t, tel, fixtureMem)

	// Past mem hard: the reader drives the state.
	write("memory.current", strconv.FormatUint(uint64(95*512<<20)/100+20971520, 10)) // + inactive_file
	waitState(t, e, decision.StateOpen)

	// Garbage in memory.current: mem invalid, counted; the state falls back.
	write("memory.current", "garbage\n")
	require.Eventually(t, func() bool { return samplerErrors(t, tel)["memory"] >= 20 }, 30*time.Second, time.Millisecond)
	waitState(t, e, decision.StateNormal)

	// A partial line in cpu.stat.
	write("cpu.stat", "usage_u")
	require.Eventually(t, func() bool { return samplerErrors(t, tel)["cpu"] >= 20 }, 30*time.Second, time.Millisecond)
	assert.NotContains(t, waterLevels(t, tel), "cpu")

	// A counter reset, then counting again.
	write("cpu.stat", "usage_usec 10\n")
	write("memory.current", "104857600\n")
	waitLevel(t, tel, fixtureMem)
	waitState(t, e, decision.StateNormal)

	warns := samplerWarns(logs)
	assert.Equal(t, 1, warns["cpu"], "%v", warns)
	assert.Equal(t, 1, warns["memory"], "%v", warns)
	require.NoError(t, e.Shutdown(context.Background()))
}

// levelsOnly leaves out the lines (the kinds ending in _enter, _exit and
// _hard), which are reported whatever the levels.
func levelsOnly(l map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range l {
		if !strings.HasSuffix(k, "_enter") && !strings.HasSuffix(k, "_exit") && !strings.HasSuffix(k, "_hard") {
			out[k] = v
		}
	}
	return out
}
