// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"context"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/downstream"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// telemetrySources is what the observable gauges read when the meter
// collects. Each is cheap and safe to call from any goroutine.
type telemetrySources struct {
	level  func() *sampler.WaterLevel
	state  func(decision.Signal) decision.State
	budget func() (reserved, limit int64)
	stale  func() bool
	held   func() int64
	// goMemLimit is the runtime's soft memory limit in bytes, 0 for none.
	goMemLimit func() int64
	// gcPercent is the GC's pace in force, 0 for GOGC=off.
	gcPercent func() int64
	// openFor is how long the state machine has been Open, 0 when not.
	openFor func() time.Duration
	// demand is the demand signal (demand.go).
	demand func() float64
	// topKeys are the busiest client keys and the others summed.
	topKeys func() ([]admission.KeyStat, admission.KeyStat)
	// mode is the mode in force: enforcing, observe_only or disabled.
	mode string
	// resources and their slots give the water_level kinds: each
	// resource's level (and averages, and details) while it is valid, and
	// the lines of each enabled slot.
	resources []resource
	slots     []decision.Slot
}

// telemetry records everything the extension reports through the
// collector's MeterProvider. All attribute sets are built once here so that
// the request path only increments a counter without allocating.
type telemetry struct {
	tb *metadata.TelemetryBuilder

	errors map[string]metric.AddOption
	plain  metric.RecordOption

	// counts are the decisions, observed as throttle_requests and read by
	// the status page (status.go).
	counts decisionCounts
}

const idKey = "extension"

// newTelemetry builds the telemetry of extension id. With observeOnly every
// denial is counted as decision=would_deny: the middleware lets those
// requests in, and a dashboard or alert on decision=denied must not take
// them for refusals.
func newTelemetry(set component.TelemetrySettings, id component.ID, observeOnly bool, src telemetrySources) (*telemetry, error) {
	tb, err := metadata.NewTelemetryBuilder(set)
	if err != nil {
		return nil, err
	}
	idAttr := attribute.String(idKey, id.String())
	t := &telemetry{
		tb:     tb,
		errors: map[string]metric.AddOption{},
		plain:  metric.WithAttributeSet(attribute.NewSet(idAttr)),
	}
	denied := "denied"
	if observeOnly {
		denied = "would_deny"
	}
	var requestOpts [admission.NumProtocols][decision.NumSignals][decision.NumVerdicts]metric.ObserveOption
	for p := range admission.NumProtocols {
		for s := range decision.NumSignals {
			for v := range decision.NumVerdicts {
				attrs := []attribute.KeyValue{
					idAttr,
					attribute.String("protocol", p.String()),
					attribute.String("signal", s.String()),
				}
				if v.Admitted() {
					attrs = append(attrs, attribute.String("decision", "allowed"))
				} else {
					attrs = append(attrs, attribute.String("decision", denied), attribute.String("reason", v.Reason()))
				}
				requestOpts[p][s][v] = metric.WithAttributeSet(attribute.NewSet(attrs...))
			}
		}
	}
	var cutOpts [admission.NumProtocols][decision.NumSignals][admission.NumCutReasons]metric.ObserveOption
	for p := range admission.NumProtocols {
		for s := range decision.NumSignals {
			for c := range admission.NumCutReasons {
				cutOpts[p][s][c] = metric.WithAttributeSet(attribute.NewSet(idAttr,
					attribute.String("protocol", p.String()), attribute.String("signal", s.String()),
					attribute.String("reason", c.String())))
			}
		}
	}
	for _, r := range []string{"cpu", "memory", "limits", downstream.Resource} {
		t.errors[r] = metric.WithAttributeSet(attribute.NewSet(idAttr, attribute.String("resource", r)))
	}

	// Only cells that counted something are observed, as a synchronous
	// counter would only have the series it was incremented with.
	err = tb.RegisterThrottleRequestsCallback(func(_ context.Context, o metric.Int64Observer) error {
		for p := range admission.NumProtocols {
			for s := range decision.NumSignals {
				for v := range decision.NumVerdicts {
					if n := t.counts.loadProtocol(p, s, v); n > 0 {
						o.Observe(int64(n), requestOpts[p][s][v]) //nolint:gosec // G115: a request count, far below 2^63
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	err = tb.RegisterThrottleCutOffRequestsCallback(func(_ context.Context, o metric.Int64Observer) error {
		for p := range admission.NumProtocols {
			for s := range decision.NumSignals {
				for c := range admission.NumCutReasons {
					if n := t.counts.cuts[p][s][c].Load(); n > 0 {
						o.Observe(int64(n), cutOpts[p][s][c]) //nolint:gosec // G115: a request count, far below 2^63
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	kind := func(k string) metric.ObserveOption {
		return metric.WithAttributeSet(attribute.NewSet(idAttr, attribute.String("kind", k)))
	}
	type levelKinds struct {
		level, slow, fast, enter, exit, hard metric.ObserveOption
		details                              []metric.ObserveOption
	}
	kinds := make([]levelKinds, len(src.resources))
	for i, r := range src.resources {
		k := &kinds[i]
		k.level, k.slow, k.fast = kind(r.name), kind(r.name+"_slow"), kind(r.name+"_fast")
		k.enter, k.exit, k.hard = kind(r.name+"_enter"), kind(r.name+"_exit"), kind(r.name+"_hard")
		for _, d := range r.details {
			k.details = append(k.details, kind(d.kind))
		}
	}
	err = tb.RegisterThrottleWaterLevelCallback(func(_ context.Context, o metric.Float64Observer) error {
		wl := src.level()
		for i, r := range src.resources {
			k := &kinds[i]
			if wl != nil && wl.Levels[i].Valid {
				l := &wl.Levels[i]
				o.Observe(l.Value, k.level)
				if r.averaged {
					o.Observe(l.Slow, k.slow)
					o.Observe(l.Fast, k.fast)
				}
				for j, d := range r.details {
					o.Observe(d.value(wl), k.details[j])
				}
			}
			if s := src.slots[i]; s.Enabled {
				o.Observe(s.Enter, k.enter)
				o.Observe(s.Exit, k.exit)
				o.Observe(s.Hard, k.hard)
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	var signalOpts [decision.NumSignals]metric.ObserveOption
	for s := range decision.NumSignals {
		signalOpts[s] = metric.WithAttributeSet(attribute.NewSet(idAttr, attribute.String("signal", s.String())))
	}
	err = tb.RegisterThrottleStateCallback(func(_ context.Context, o metric.Int64Observer) error {
		for s := range decision.NumSignals {
			o.Observe(int64(src.state(s)), signalOpts[s])
		}
		return nil
	})
	if err != nil {
		return nil, err
	}

	reservedOpt := metric.WithAttributeSet(attribute.NewSet(idAttr, attribute.String("budget", "reserved")))
	limitOpt := metric.WithAttributeSet(attribute.NewSet(idAttr, attribute.String("budget", "limit")))
	err = tb.RegisterThrottleInflightBytesCallback(func(_ context.Context, o metric.Int64Observer) error {
		reserved, limit := src.budget()
		o.Observe(reserved, reservedOpt)
		o.Observe(limit, limitOpt)
		return nil
	})
	if err != nil {
		return nil, err
	}

	err = tb.RegisterThrottleKeyInflightBytesCallback(func(_ context.Context, o metric.Int64Observer) error {
		if src.topKeys == nil {
			return nil
		}
		top, other := src.topKeys()
		for _, k := range append(top, other) {
			o.Observe(k.Reserved, metric.WithAttributes(idAttr, attribute.String("key", k.Name)))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = tb.RegisterThrottleKeyRequestsCallback(func(_ context.Context, o metric.Int64Observer) error {
		if src.topKeys == nil {
			return nil
		}
		top, other := src.topKeys()
		for _, k := range append(top, other) {
			name := attribute.String("key", k.Name)
			o.Observe(k.Admitted, metric.WithAttributes(idAttr, name, attribute.String("decision", "allowed")))
			o.Observe(k.Refused, metric.WithAttributes(idAttr, name, attribute.String("decision", denied)))
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	modeObserve := metric.WithAttributeSet(attribute.NewSet(idAttr, attribute.String("mode", src.mode)))
	err = tb.RegisterThrottleModeCallback(func(_ context.Context, o metric.Int64Observer) error {
		o.Observe(1, modeObserve)
		return nil
	})
	if err != nil {
		return nil, err
	}

	plainObserve := metric.WithAttributeSet(attribute.NewSet(idAttr))
	err = tb.RegisterThrottleHeldRequestsCallback(func(_ context.Context, o metric.Int64Observer) error {
		o.Observe(src.held(), plainObserve)
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = tb.RegisterThrottleGoMemoryLimitCallback(func(_ context.Context, o metric.Int64Observer) error {
		if src.goMemLimit != nil {
			o.Observe(src.goMemLimit(), plainObserve)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = tb.RegisterThrottleGcPercentCallback(func(_ context.Context, o metric.Int64Observer) error {
		if src.gcPercent != nil {
			o.Observe(src.gcPercent(), plainObserve)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = tb.RegisterThrottleOpenDurationCallback(func(_ context.Context, o metric.Float64Observer) error {
		if src.openFor != nil {
			o.Observe(src.openFor().Seconds(), plainObserve)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = tb.RegisterThrottleDemandCallback(func(_ context.Context, o metric.Float64Observer) error {
		if src.demand != nil {
			o.Observe(src.demand(), plainObserve)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = tb.RegisterThrottleSamplerStaleCallback(func(_ context.Context, o metric.Int64Observer) error {
		var v int64
		if src.stale() {
			v = 1
		}
		o.Observe(v, plainObserve)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return t, nil
}

// record counts one decision. It is on the request path: no allocation.
func (t *telemetry) record(p admission.Protocol, s decision.Signal, v decision.Verdict) {
	if p >= admission.NumProtocols || s >= decision.NumSignals || v >= decision.NumVerdicts {
		return
	}
	t.counts.add(p, s, v)
}

// cutOff counts one admitted request cut off. No allocation.
func (t *telemetry) cutOff(p admission.Protocol, s decision.Signal, c admission.CutReason) {
	if p >= admission.NumProtocols || s >= decision.NumSignals || c >= admission.NumCutReasons {
		return
	}
	t.counts.cuts[p][s][c].Add(1)
}

// sampled records one published sample: how long it took and the time since
// the previous one (0 for the first).
func (t *telemetry) sampled(took, interval time.Duration) {
	ctx := context.Background()
	t.tb.ThrottleSamplerDuration.Record(ctx, took.Seconds(), t.plain)
	if interval > 0 {
		t.tb.ThrottleSamplerInterval.Record(ctx, interval.Seconds(), t.plain)
	}
}

// samplerError counts a failed read or skipped frame of resource.
func (t *telemetry) samplerError(resource string) {
	opt, ok := t.errors[resource]
	if !ok {
		opt = t.errors["limits"]
	}
	t.tb.ThrottleSamplerErrors.Add(context.Background(), 1, opt)
}

func (t *telemetry) shutdown() { t.tb.Shutdown() }
