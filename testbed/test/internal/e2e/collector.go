// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package e2e // import "github.com/otelthrottle/throttle/testbed/test/internal/e2e"

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/otelcol"
	"go.opentelemetry.io/collector/service/telemetry"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// yamlProvider serves one rendered config under the "test:" scheme.
type yamlProvider struct{ yaml []byte }

func (p *yamlProvider) Retrieve(context.Context, string, confmap.WatcherFunc) (*confmap.Retrieved, error) {
	return confmap.NewRetrievedFromYAML(p.yaml)
}
func (*yamlProvider) Scheme() string                 { return "test" }
func (*yamlProvider) Shutdown(context.Context) error { return nil }

// ConfigProviderSettings makes yaml the collector's whole configuration.
func ConfigProviderSettings(yaml []byte) otelcol.ConfigProviderSettings {
	provider := &yamlProvider{yaml: yaml}
	return otelcol.ConfigProviderSettings{
		ResolverSettings: confmap.ResolverSettings{
			URIs: []string{"test:config"},
			ProviderFactories: []confmap.ProviderFactory{
				confmap.NewProviderFactory(func(confmap.ProviderSettings) confmap.Provider { return provider }),
			},
		},
	}
}

// TelemetryFactory is the collector's own telemetry for a test: logs to
// logs, metrics to a reader the test collects from. (The distribution's
// otelconftelemetry with its Prometheus endpoint is covered by the
// distribution smoke test; it would pull otelconf's resource detectors into
// this module's dependencies.) A config for it has no service::telemetry
// section.
func TelemetryFactory(logs zapcore.Core, reader sdkmetric.Reader) telemetry.Factory {
	type cfg struct{}
	return telemetry.NewFactory(
		func() component.Config { return &cfg{} },
		telemetry.WithCreateLogger(func(context.Context, telemetry.LoggerSettings, component.Config) (*zap.Logger, component.ShutdownFunc, error) {
			return zap.New(logs), nil, nil
		}),
		telemetry.WithCreateMeterProvider(func(context.Context, telemetry.MeterSettings, component.Config) (telemetry.MeterProvider, error) {
			return sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)), nil
		}),
	)
}

// Collector is a whole collector run in the test process by otelcol's own
// Collector, exactly as a distribution runs it but without ocb: its logs go
// to Logs (Info and above), its metrics to a reader that Samples collects.
type Collector struct {
	Logs *observer.ObservedLogs

	reader  *sdkmetric.ManualReader
	col     *otelcol.Collector
	runErr  chan error
	stopped bool
}

// startMu is held while a collector starts.
var startMu sync.Mutex

// StartCollector runs a collector with the components of factories (its
// Telemetry is replaced by the test's) and the configuration yaml, and
// returns once it is Running; it fails the test if the collector does not
// start within 30 s. The collector is stopped when the test ends (Stop),
// and its logs are printed if the test failed.
func StartCollector(tb testing.TB, factories func() (otelcol.Factories, error), yaml []byte) *Collector {
	tb.Helper()
	core, logs := observer.New(zapcore.InfoLevel)
	c := &Collector{Logs: logs, reader: sdkmetric.NewManualReader(), runErr: make(chan error, 1)}
	col, err := otelcol.NewCollector(otelcol.CollectorSettings{
		BuildInfo: component.BuildInfo{Command: "otelcol-throttle-test", Version: "test"},
		Factories: func() (otelcol.Factories, error) {
			f, err := factories()
			f.Telemetry = TelemetryFactory(core, c.reader)
			return f, err
		},
		DisableGracefulShutdown: true, // no signal handlers in a test process
		ConfigProviderSettings:  ConfigProviderSettings(yaml),
	})
	require.NoError(tb, err)
	c.col = col

	// Starting, otelcol sets process-wide state (grpc-go's logger) without
	// a lock: collectors of parallel tests start one at a time.
	startMu.Lock()
	defer startMu.Unlock()
	// Run returns when the collector stops: after Shutdown, or at once when
	// it fails to start.
	go func() { c.runErr <- col.Run(context.Background()) }()
	tb.Cleanup(func() {
		c.Stop(tb)
		if tb.Failed() {
			for _, e := range logs.All() {
				tb.Logf("%s %s %s %v", e.Time.Format("15:04:05.000"), e.Level, e.Message, e.ContextMap())
			}
		}
	})

	// Wait until Running, or fail at once if Run gave up.
	deadline := time.After(30 * time.Second)
	for col.GetState() != otelcol.StateRunning {
		select {
		case <-deadline:
			require.FailNow(tb, "collector not Running after 30s", "state %v", col.GetState())
		case err := <-c.runErr:
			c.stopped = true
			require.FailNow(tb, "collector failed to start", "%v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	return c
}

// Stop shuts the collector down and waits up to 30 s for Run to return,
// reporting an error of Run or a timeout as a test error. Calling it again
// does nothing.
func (c *Collector) Stop(tb testing.TB) {
	tb.Helper()
	if c.stopped {
		return
	}
	c.stopped = true
	c.col.Shutdown()
	select {
	case err := <-c.runErr:
		if err != nil {
			tb.Errorf("collector Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		tb.Error("collector did not stop within 30s of Shutdown")
	}
}

// State is the collector's state.
func (c *Collector) State() otelcol.State { return c.col.GetState() }

// Samples collects the collector's own metrics (sums and gauges; histograms
// as their count).
func (c *Collector) Samples(tb testing.TB) []Sample {
	tb.Helper()
	return Collect(tb, c.reader)
}

// Collect reads the metrics of reader as samples (sums and gauges;
// histograms as their count); a failed collection is logged and gives none.
func Collect(tb testing.TB, reader sdkmetric.Reader) []Sample {
	tb.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		tb.Logf("collect: %v", err)
		return nil
	}
	var out []Sample
	add := func(name string, attrs attribute.Set, v float64) {
		labels := map[string]string{}
		for _, kv := range attrs.ToSlice() {
			labels[string(kv.Key)] = kv.Value.String()
		}
		out = append(out, Sample{Name: name, Labels: labels, Value: v})
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				addPoints(add, m.Name, d.DataPoints)
			case metricdata.Sum[float64]:
				addPoints(add, m.Name, d.DataPoints)
			case metricdata.Gauge[int64]:
				addPoints(add, m.Name, d.DataPoints)
			case metricdata.Gauge[float64]:
				addPoints(add, m.Name, d.DataPoints)
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					add(m.Name, dp.Attributes, float64(dp.Count))
				}
			}
		}
	}
	return out
}

// addPoints adds the values of dps under name.
func addPoints[N int64 | float64](add func(string, attribute.Set, float64), name string, dps []metricdata.DataPoint[N]) {
	for _, dp := range dps {
		add(name, dp.Attributes, float64(dp.Value))
	}
}
