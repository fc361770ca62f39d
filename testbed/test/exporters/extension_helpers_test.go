// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package exporters

// Helpers of extension_test.go, after the extension's own end-to-end
// helpers (extension/throttleextension/e2e_helpers_test.go): the real
// otlpreceiver with the throttle as its HTTP and gRPC middleware, a started
// throttle extension whose water level the test drives through a fake
// resource source, and real OTLP exporters as clients.

import (
	"context"
	"errors"
	"maps"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/exporter"
	"go.opentelemetry.io/collector/exporter/exportertest"
	"go.opentelemetry.io/collector/exporter/otlpexporter"
	"go.opentelemetry.io/collector/exporter/otlphttpexporter"
	"go.opentelemetry.io/collector/exporter/xexporter"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/receiver/xreceiver"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/testutil"
	"github.com/otelthrottle/throttle/internal/throttleapi"
	"github.com/otelthrottle/throttle/testbed/test/internal/e2e"
)

// e2eMemLimit is the memory limit the fake source reports. 1 GiB keeps the
// "auto" admission budget (limit/12 = 85 MiB) out of the way of the tests,
// which are about the state machines.
const e2eMemLimit = 1 << 30

// Memory levels, as a share of e2eMemLimit, against the test thresholds
// (mem enter 0.5, exit 0.4, hard 0.9).
const (
	e2eCalm = 0.1  // under every line: Normal
	e2eOpen = 0.95 // over hard: Open
)

// e2eMinRetry and e2eMaxRetry bound the retry_after range of the tests: at
// least one second so that Retry-After (whole seconds) is not 0 and the
// exporters really wait, short so that the retry tests stay quick.
const (
	e2eMinRetry = time.Second
	e2eMaxRetry = 2 * time.Second
)

// e2eWait bounds every wait of the tests.
const e2eWait = 30 * time.Second

// e2eEnv is a started throttle extension and a started otlpreceiver (gRPC
// and HTTP, both with middlewares: [{id: throttle}]) feeding sinks.
type e2eEnv struct {
	src *testutil.Source
	th  throttleapi.Throttle
	tel *componenttest.Telemetry

	httpAddr, grpcAddr string

	traces   *consumertest.TracesSink
	metrics  *consumertest.MetricsSink
	logs     *consumertest.LogsSink
	profiles *consumertest.ProfilesSink
}

// e2eThrottleConfig is the throttle configuration of the tests: a 10ms
// check interval, no CPU slot (the fake source uses none), a memory slot
// that reacts to one check, no recovery ramp so that leaving Open is
// immediate, no stale fallback (a sampler starved under -race must not turn
// Open into Normal), a short retry_after range, no tarpit and no hold;
// top-level keys of extra replace these.
func e2eThrottleConfig(extra map[string]any) map[string]any {
	conf := map[string]any{
		"check_interval": "10ms",
		"recovery_ramp":  "0s",
		"stale_after":    "0s",
		"retry_after":    map[string]any{"min": e2eMinRetry.String(), "max": e2eMaxRetry.String()},
		"tarpit":         map[string]any{"delay": "0s"},
		// Refusals are answered at once.
		"hold":   map[string]any{"max_wait": "0s"},
		"cpu":    map[string]any{"enabled": false},
		"memory": map[string]any{"enabled": true, "enter": 0.5, "exit": 0.4, "hard": 0.9, "breach_duration": "0s"},
	}
	maps.Copy(conf, extra)
	return conf
}

// startE2E starts the throttle extension and the otlpreceiver that uses it
// as the middleware of both its servers.
func startE2E(tb testing.TB, conf map[string]any) *e2eEnv {
	tb.Helper()
	ctx := context.Background()
	env := &e2eEnv{
		src:      testutil.NewSource(cgroup.Limits{MemLimit: e2eMemLimit}),
		tel:      componenttest.NewTelemetry(),
		traces:   new(consumertest.TracesSink),
		metrics:  new(consumertest.MetricsSink),
		logs:     new(consumertest.LogsSink),
		profiles: new(consumertest.ProfilesSink),
	}
	env.src.SetMemoryShare(e2eCalm)
	tb.Cleanup(func() { require.NoError(tb, env.tel.Shutdown(ctx)) })
	ext, th := startThrottle(tb, env.src, e2eThrottleConfig(conf), env.tel)
	env.th = th

	// A free port can be taken by another test between freeAddr and the
	// receiver's listen: start again on new ones.
	var err error
	for range 5 {
		if err = env.startReceiver(tb, ext); !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	require.NoError(tb, err)
	return env
}

// startReceiver starts the otlpreceiver with the throttle extension ext as
// the middleware of both its servers, on two new free addresses.
func (env *e2eEnv) startReceiver(tb testing.TB, ext component.Component) error {
	tb.Helper()
	ctx := context.Background()
	// The receiver, configured as a user would in YAML.
	env.httpAddr, env.grpcAddr = freeAddr(tb), freeAddr(tb)
	middlewares := []any{map[string]any{"id": "throttle"}}
	rf := otlpreceiver.NewFactory()
	rcfg := rf.CreateDefaultConfig()
	require.NoError(tb, confmap.NewFromStringMap(map[string]any{
		"protocols": map[string]any{
			"grpc": map[string]any{"endpoint": env.grpcAddr, "middlewares": middlewares},
			"http": map[string]any{"endpoint": env.httpAddr, "middlewares": middlewares},
		},
	}).Unmarshal(rcfg))
	require.NoError(tb, confmap.Validate(rcfg))

	rset := receivertest.NewNopSettings(rf.Type())
	// otlpreceiver shares one server between the receivers of one config:
	// creating all four registers every signal, starting one starts it.
	tr, err := rf.CreateTraces(ctx, rset, rcfg, env.traces)
	require.NoError(tb, err)
	mr, err := rf.CreateMetrics(ctx, rset, rcfg, env.metrics)
	require.NoError(tb, err)
	lr, err := rf.CreateLogs(ctx, rset, rcfg, env.logs)
	require.NoError(tb, err)
	pr, err := rf.(xreceiver.Factory).CreateProfiles(ctx, rset, rcfg, env.profiles)
	require.NoError(tb, err)
	rcvs := []component.Component{tr, mr, lr, pr}
	host := hostWith(component.MustNewID("throttle"), ext)
	var started []component.Component
	tb.Cleanup(func() {
		for _, r := range started {
			require.NoError(tb, r.Shutdown(ctx))
		}
	})
	for _, r := range rcvs {
		if err := r.Start(ctx, host); err != nil {
			return errors.Join(err, r.Shutdown(ctx))
		}
		started = append(started, r)
	}
	return nil
}

// setLevel sets the memory level and waits until the state machines (every
// signal shares them) are in want.
func (env *e2eEnv) setLevel(tb testing.TB, level float64, want decision.State) {
	tb.Helper()
	env.src.SetMemoryShare(level)
	waitState(tb, env.th, want, e2eWait)
}

// requests is the throttle_requests counter for one protocol, signal and
// decision (see e2edata.Requests).
func (env *e2eEnv) requests(tb testing.TB, protocol string, s decision.Signal, decision, reason string) int64 {
	tb.Helper()
	return e2edata.Requests(tb, env.tel, protocol, s.String(), decision, reason)
}

// e2eSignal is one signal as the tests count it at env's sinks.
type e2eSignal struct {
	sig      decision.Signal
	received func(env *e2eEnv) int
}

var e2eSignals = []e2eSignal{
	{decision.SignalTraces, func(env *e2eEnv) int { return env.traces.SpanCount() }},
	{decision.SignalMetrics, func(env *e2eEnv) int { return env.metrics.DataPointCount() }},
	{decision.SignalLogs, func(env *e2eEnv) int { return env.logs.LogRecordCount() }},
	{decision.SignalProfiles, func(env *e2eEnv) int { return env.profiles.SampleCount() }},
}

// e2eExporters are real OTLP exporters of every signal for one protocol.
type e2eExporters struct {
	protocol string // "http" or "grpc", as in throttle_requests
	send     map[decision.Signal]func(ctx context.Context, n int) error
}

// startExporters starts otlphttpexporter (protocol "http") or otlpexporter
// ("grpc") for every signal, without a sending queue (an export returns
// when its data is delivered or given up, so nothing needs to be waited
// for), with retries on a short back-off bounded at 30s. They are shut down
// when the test ends.
func (env *e2eEnv) startExporters(tb testing.TB, protocol string) *e2eExporters {
	tb.Helper()
	ctx := context.Background()
	conf := map[string]any{
		"timeout":       "5s",
		"sending_queue": map[string]any{"enabled": false},
		"retry_on_failure": map[string]any{
			"enabled":          true,
			"initial_interval": "50ms",
			"max_interval":     "200ms",
			"max_elapsed_time": "30s",
		},
	}
	var ef exporter.Factory
	switch protocol {
	case "http":
		ef = otlphttpexporter.NewFactory()
		conf["endpoint"] = "http://" + env.httpAddr
	case "grpc":
		ef = otlpexporter.NewFactory()
		conf["endpoint"] = env.grpcAddr
		conf["tls"] = map[string]any{"insecure": true}
	default:
		tb.Fatalf("unknown protocol %q", protocol)
	}
	cfg := ef.CreateDefaultConfig()
	require.NoError(tb, confmap.NewFromStringMap(conf).Unmarshal(cfg))
	require.NoError(tb, confmap.Validate(cfg))
	set := exportertest.NewNopSettings(ef.Type())

	start := func(c component.Component) {
		require.NoError(tb, c.Start(ctx, componenttest.NewNopHost()))
		tb.Cleanup(func() { require.NoError(tb, c.Shutdown(ctx)) })
	}
	te, err := ef.CreateTraces(ctx, set, cfg)
	require.NoError(tb, err)
	me, err := ef.CreateMetrics(ctx, set, cfg)
	require.NoError(tb, err)
	le, err := ef.CreateLogs(ctx, set, cfg)
	require.NoError(tb, err)
	pe, err := ef.(xexporter.Factory).CreateProfiles(ctx, set, cfg)
	require.NoError(tb, err)
	for _, c := range []component.Component{te, me, le, pe} {
		start(c)
	}
	return &e2eExporters{
		protocol: protocol,
		send: map[decision.Signal]func(context.Context, int) error{
			decision.SignalTraces:   func(ctx context.Context, n int) error { return te.ConsumeTraces(ctx, e2edata.Traces(n)) },
			decision.SignalMetrics:  func(ctx context.Context, n int) error { return me.ConsumeMetrics(ctx, e2edata.Metrics(n)) },
			decision.SignalLogs:     func(ctx context.Context, n int) error { return le.ConsumeLogs(ctx, e2edata.Logs(n)) },
			decision.SignalProfiles: func(ctx context.Context, n int) error { return pe.ConsumeProfiles(ctx, e2edata.Profiles(n)) },
		},
	}
}

// startThrottle creates the throttle extension with the extension's own
// factory, reading src, configured with conf (keys of the throttle
// configuration) and counting into tel (no-op telemetry when nil), and
// starts it; it is shut down when the test ends.
func startThrottle(tb testing.TB, src *testutil.Source, conf map[string]any, tel *componenttest.Telemetry) (component.Component, throttleapi.Throttle) {
	tb.Helper()
	ctx := context.Background()
	f := e2e.ExtensionFactory(src)
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

// waitState waits until every signal's state machine is in want.
func waitState(tb testing.TB, th throttleapi.Throttle, want decision.State, wait time.Duration) {
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

// host is a component.Host holding the given extensions.
type host map[component.ID]component.Component

func (h host) GetExtensions() map[component.ID]component.Component { return h }

// hostWith returns a host holding ext under id.
func hostWith(id component.ID, ext component.Component) component.Host { return host{id: ext} }
