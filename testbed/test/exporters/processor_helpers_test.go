// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package exporters

// Helpers of processor_test.go: the throttles the processor follows (a fake
// whose verdicts the test sets, and the real extension), and the expected
// data points of the processor's counters.

import (
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testutil"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// fakeThrottle is a throttle extension whose verdicts the test sets.
type fakeThrottle struct {
	component.StartFunc
	component.ShutdownFunc

	verdicts [decision.Profiles + 1]atomic.Uint32
	delay    time.Duration
}

var _ throttleapi.Throttle = (*fakeThrottle)(nil)

func newFakeThrottle(delay time.Duration) *fakeThrottle {
	return &fakeThrottle{delay: delay}
}

func (f *fakeThrottle) set(s decision.Signal, v decision.Verdict) {
	f.verdicts[s].Store(uint32(v))
}

func (f *fakeThrottle) Decide(s decision.Signal) decision.Verdict {
	return decision.Verdict(f.verdicts[s].Load())
}

func (f *fakeThrottle) RetryDelay(decision.Verdict) time.Duration { return f.delay }

func (f *fakeThrottle) State(s decision.Signal) decision.State {
	if f.Decide(s) == decision.DenyOpen {
		return decision.Open
	}
	return decision.Normal
}

func (*fakeThrottle) ObserveOnly() bool { return false }

func (*fakeThrottle) RecordProcessorDecision(decision.Signal, decision.Verdict) {}

// Memory of the real extension's fake source, against the default memory
// thresholds (enter 0.85, hard 0.92).
const (
	fakeMemLimit   = 1000
	fakeCalm       = 0.10 // under every memory line
	fakeOverloaded = 0.95 // over mem hard: Open in one sample
)

// Retry range of the real extension in tests: short, so that clients retry
// soon, and at least one second so that Retry-After (whole seconds) is not 0.
const (
	testMinRetry = time.Second
	testMaxRetry = 2 * time.Second
)

// realThrottle is a started throttle extension built by the extension's own
// factory, whose water level the test drives through its resource source.
type realThrottle struct {
	throttleapi.Throttle
	ext component.Component
	src *testutil.Source
}

// startRealThrottle creates and starts a throttle extension with a 10ms
// check interval, no CPU slot, no recovery ramp, and retry_after
// [testMinRetry, testMaxRetry], plus the given configuration keys (top-level
// keys replace the defaults above). It is shut down when the test ends.
func startRealThrottle(tb testing.TB, extra ...map[string]any) *realThrottle {
	tb.Helper()
	src := testutil.NewSource(cgroup.Limits{MemLimit: fakeMemLimit})
	src.SetMemoryShare(fakeCalm)
	conf := map[string]any{
		"check_interval": "10ms",
		"recovery_ramp":  "0s",
		// A sampler starved under -race must not turn Open into Normal.
		"stale_after": "0s",
		"retry_after": map[string]any{"min": testMinRetry.String(), "max": testMaxRetry.String()},
		"cpu":         map[string]any{"enabled": false},
	}
	for _, e := range extra {
		maps.Copy(conf, e)
	}
	ext, th := startThrottle(tb, src, conf, nil)
	rt := &realThrottle{Throttle: th, ext: ext, src: src}
	rt.waitState(tb, decision.Normal)
	return rt
}

// host returns a host holding the extension under the processor's default
// extension ID.
func (rt *realThrottle) host() component.Host {
	return hostWith(defaultExtensionID, rt.ext)
}

// overload puts every signal in Open (one sample over mem hard) and waits
// until the state machines say so.
func (rt *realThrottle) overload(tb testing.TB) {
	tb.Helper()
	rt.src.SetMemoryShare(fakeOverloaded)
	rt.waitState(tb, decision.Open)
}

// calm brings the memory level under every line and waits for Normal.
func (rt *realThrottle) calm(tb testing.TB) {
	tb.Helper()
	rt.src.SetMemoryShare(fakeCalm)
	rt.waitState(tb, decision.Normal)
}

func (rt *realThrottle) waitState(tb testing.TB, want decision.State) {
	tb.Helper()
	waitState(tb, rt, want, 10*time.Second)
}

// outcomeNames are the values of the processor counters' outcome attribute.
var outcomeNames = []string{"passed", "refused", "dropped"}

// outcomePoints are the expected data points of one processor's counters.
func outcomePoints(sig decision.Signal, values map[string]int64) []metricdata.DataPoint[int64] {
	var dps []metricdata.DataPoint[int64]
	for _, o := range outcomeNames {
		v, ok := values[o]
		if !ok {
			continue
		}
		dps = append(dps, metricdata.DataPoint[int64]{
			Attributes: attribute.NewSet(
				attribute.String("processor", "throttle"),
				attribute.String("signal", sig.String()),
				attribute.String("outcome", o),
			),
			Value: v,
		})
	}
	return dps
}
