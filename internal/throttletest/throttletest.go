// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package throttletest holds the throttles that this repository's tests
// outside the extension run the processor and the receivers against: Fake,
// whose verdicts the test sets, and the real extension, built by its own
// factory over a testutil.Source (Start, StartReal); and the data points the
// processor's counter should show (ProcessorOutcomePoints). It is apart from
// internal/testutil because it imports the decision package and the
// extension, whose own tests use testutil.
package throttletest // import "github.com/otelthrottle/throttle/internal/throttletest"

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testseam"
	"github.com/otelthrottle/throttle/internal/testutil"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// Fake is a throttle extension whose verdicts the test sets. It records
// every call the processor makes.
type Fake struct {
	component.StartFunc
	component.ShutdownFunc

	delay   time.Duration
	decides [decision.NumSignals]atomic.Int64

	mu       sync.Mutex
	verdicts [decision.NumSignals]decision.Verdict
	recorded []Recorded
}

// Recorded is one processor decision reported to a Fake.
type Recorded struct {
	Signal  decision.Signal
	Verdict decision.Verdict
}

var _ throttleapi.Throttle = (*Fake)(nil)

// NewFake returns a Fake that admits everything and whose RetryDelay is
// delay.
func NewFake(delay time.Duration) *Fake { return &Fake{delay: delay} }

// Set makes v the verdict, and the state it implies, of signal s.
func (f *Fake) Set(s decision.Signal, v decision.Verdict) {
	f.mu.Lock()
	f.verdicts[s] = v
	f.mu.Unlock()
}

// SetAll makes v the verdict of every signal.
func (f *Fake) SetAll(v decision.Verdict) {
	for s := range decision.NumSignals {
		f.Set(s, v)
	}
}

// Decides is how many times Decide was called for s.
func (f *Fake) Decides(s decision.Signal) int64 { return f.decides[s].Load() }

// Recorded returns the processor decisions reported so far, oldest first.
func (f *Fake) Recorded() []Recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Recorded(nil), f.recorded...)
}

func (f *Fake) Decide(s decision.Signal) decision.Verdict {
	f.decides[s].Add(1)
	return f.verdict(s)
}

func (f *Fake) verdict(s decision.Signal) decision.Verdict {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.verdicts[s]
}

func (f *Fake) RetryDelay(decision.Verdict) time.Duration { return f.delay }

// State is Open for a signal refused as in Open, Normal otherwise.
func (f *Fake) State(s decision.Signal) decision.State {
	if f.verdict(s) == decision.VerdictDenyOpen {
		return decision.StateOpen
	}
	return decision.StateNormal
}

func (*Fake) ObserveOnly() bool { return false }

func (f *Fake) RecordProcessorDecision(s decision.Signal, v decision.Verdict) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recorded = append(f.recorded, Recorded{s, v})
}

// host is a component.Host holding the given extensions.
type host struct {
	extensions map[component.ID]component.Component
}

func (h host) GetExtensions() map[component.ID]component.Component { return h.extensions }

// HostWith returns a host holding ext under id.
func HostWith(id component.ID, ext component.Component) component.Host {
	return host{extensions: map[component.ID]component.Component{id: ext}}
}

// Start creates the throttle extension with the extension's own factory,
// reading src, configured with conf (keys of the throttle configuration)
// and counting into tel (no-op telemetry when nil), and starts it; it is
// shut down when the test ends.
func Start(tb testing.TB, src *testutil.Source, conf map[string]any, tel *componenttest.Telemetry) (component.Component, throttleapi.Throttle) {
	tb.Helper()
	ctx := context.Background()
	f := testseam.ExtensionFactory(src)
	cfg := f.CreateDefaultConfig()
	require.NoError(tb, confmap.NewFromStringMap(conf).Unmarshal(cfg))
	require.NoError(tb, confmap.Validate(cfg))
	set := extensiontest.NewNopSettings(f.Type())
	set.ID = component.NewID(f.Type())
	if tel != nil {
		set.TelemetrySettings = tel.NewTelemetrySettings()
	}
	ext, err := f.Create(ctx, set, cfg)
	require.NoError(tb, err)
	th, ok := ext.(throttleapi.Throttle)
	require.Truef(tb, ok, "the extension (%T) does not implement throttleapi.Throttle", ext)
	require.NoError(tb, ext.Start(ctx, componenttest.NewNopHost()))
	tb.Cleanup(func() { require.NoError(tb, ext.Shutdown(ctx)) })
	return ext, th
}

// WaitState waits until every signal's state machine is in want.
func WaitState(tb testing.TB, th throttleapi.Throttle, want decision.State, wait time.Duration) {
	tb.Helper()
	require.Eventuallyf(tb, func() bool {
		for s := range decision.NumSignals {
			if th.State(s) != want {
				return false
			}
		}
		return true
	}, wait, time.Millisecond, "waiting for every signal to be %v", want)
}

// The memory levels a Real's source is set to, against the default memory
// lines (enter 0.85, hard 0.92).
const (
	Calm       = 0.10 // under every memory line
	Shedding   = 0.88 // between enter and hard
	Overloaded = 0.95 // over hard: Open in one sample
)

// The retry_after range of a Real: short, so that clients retry soon, and
// at least one second so that Retry-After (whole seconds) is not 0.
const (
	MinRetry = time.Second
	MaxRetry = 2 * time.Second
)

// Real is a started throttle extension built by the extension's own
// factory, whose water level the test drives through its source, and the
// telemetry it counts into.
type Real struct {
	throttleapi.Throttle
	Ext component.Component
	Src *testutil.Source
	Tel *componenttest.Telemetry
}

// StartReal creates and starts a throttle extension at the Calm level, with
// a 10ms check interval, no CPU slot, no recovery ramp, and retry_after
// [MinRetry, MaxRetry], plus the given configuration keys (top-level keys
// replace the defaults above). It is shut down when the test ends.
func StartReal(tb testing.TB, extra ...map[string]any) *Real {
	tb.Helper()
	src := testutil.NewSource(cgroup.Limits{MemLimit: 1000})
	src.SetMemoryShare(Calm)
	conf := map[string]any{
		"check_interval": "10ms",
		"recovery_ramp":  "0s",
		// A sampler starved under -race must not turn Open into Normal.
		"stale_after": "0s",
		"retry_after": map[string]any{"min": MinRetry.String(), "max": MaxRetry.String()},
		"cpu":         map[string]any{"enabled": false},
	}
	for _, e := range extra {
		maps.Copy(conf, e)
	}
	tel := componenttest.NewTelemetry()
	tb.Cleanup(func() { require.NoError(tb, tel.Shutdown(context.Background())) })
	ext, th := Start(tb, src, conf, tel)
	r := &Real{Throttle: th, Ext: ext, Src: src, Tel: tel}
	r.SetLevel(tb, Calm, decision.StateNormal)
	return r
}

// SetLevel sets the memory level and waits until every signal is in want.
func (r *Real) SetLevel(tb testing.TB, level float64, want decision.State) {
	tb.Helper()
	r.Src.SetMemoryShare(level)
	WaitState(tb, r, want, 10*time.Second)
}

// ProcessorOutcomePoints are the expected data points of the throttle
// processor's item counter for one signal: values by outcome ("passed",
// "refused", "dropped"); an outcome left out has no point.
func ProcessorOutcomePoints(sig decision.Signal, values map[string]int64) []metricdata.DataPoint[int64] {
	var dps []metricdata.DataPoint[int64]
	for _, o := range []string{"passed", "refused", "dropped"} {
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
