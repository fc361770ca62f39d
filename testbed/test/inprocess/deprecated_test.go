// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package inprocess

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.opentelemetry.io/collector/otelcol"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/testbed/test/internal/e2e"
)

// collectorConfig resolves and decodes yaml as the collector does, with
// this package's factories.
func collectorConfig(t *testing.T, yaml string) (*otelcol.Config, otelcol.Factories, error) {
	t.Helper()
	cp, err := otelcol.NewConfigProvider(e2e.ConfigProviderSettings([]byte(yaml)))
	require.NoError(t, err)
	core, _ := observer.New(zapcore.InfoLevel)
	f, err := factories(newFakeSource(0))()
	require.NoError(t, err)
	f.Telemetry = e2e.TelemetryFactory(core, sdkmetric.NewManualReader())
	cfg, err := cp.Get(context.Background(), f)
	return cfg, f, err
}

const deprecatedPipeline = `
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:0
exporters:
  nop: {}
service:
  extensions: [throttle]
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [nop]
`

// TestDeprecatedNamesThroughTheCollector: the previous release's names go
// through the collector's own configuration loading to the same settings
// as the new ones, and the extension warns of each when it is created; a
// setting under both names fails the collector's configuration.
func TestDeprecatedNamesThroughTheCollector(t *testing.T) {
	id := component.MustNewID("throttle")
	load := func(t *testing.T, throttle string) (component.Config, otelcol.Factories) {
		t.Helper()
		cfg, f, err := collectorConfig(t, "extensions:\n  throttle:\n"+throttle+deprecatedPipeline)
		require.NoError(t, err)
		require.NoError(t, cfg.Validate())
		return cfg.Extensions[id], f
	}
	old, f := load(t, `
    sample_interval: 100ms
    thresholds:
      mem: { enter: 0.8, exit: 0.7, hard: 0.9, breach_n: 2 }
    queue: { max_held: 32 }
`)
	cur, _ := load(t, `
    check_interval: 100ms
    memory: { enter: 0.8, exit: 0.7, hard: 0.9, breach_duration: 200ms }
    hold: { max_requests: 32 }
`)

	warnings := func(cfg component.Config) []string {
		core, logs := observer.New(zapcore.WarnLevel)
		set := extensiontest.NewNopSettings(id.Type())
		set.Logger = zap.New(core)
		ext, err := f.Extensions[id.Type()].Create(context.Background(), set, cfg)
		require.NoError(t, err)
		require.NoError(t, ext.Shutdown(context.Background()))
		var msgs []string
		for _, e := range logs.All() {
			msgs = append(msgs, e.Message)
		}
		return msgs
	}
	assert.Equal(t, []string{
		"`sample_interval` is deprecated: use `check_interval`",
		"`thresholds::mem::enter` is deprecated: use `memory::enter`",
		"`thresholds::mem::exit` is deprecated: use `memory::exit`",
		"`thresholds::mem::hard` is deprecated: use `memory::hard`",
		"`thresholds::mem::breach_n` is deprecated: use `memory::breach_duration` (2 × check_interval 100ms = 200ms)",
		"`queue::max_held` is deprecated: use `hold::max_requests`",
	}, warnings(old))
	assert.Empty(t, warnings(cur))
	// Marshalled as print-config does, both read the same: the new names.
	oldConf, curConf := confmap.New(), confmap.New()
	require.NoError(t, oldConf.Marshal(old))
	require.NoError(t, curConf.Marshal(cur))
	assert.Equal(t, curConf.ToStringMap(), oldConf.ToStringMap())

	_, _, err := collectorConfig(t, "extensions:\n  throttle:\n    sample_interval: 100ms\n    check_interval: 200ms\n"+deprecatedPipeline)
	require.ErrorContains(t, err, "`sample_interval` is deprecated and its replacement is set too (`check_interval`): remove `sample_interval`")
}
