// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
)

// TestRenderConfigThrottleYAML: -throttle-config replaces the throttle
// extension's settings, re-indented under extensions.throttle.
func TestRenderConfigThrottleYAML(t *testing.T) {
	b, err := renderConfig(colConfig{
		GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, Throttle: true, Thresholds: "benchmark",
		ThrottleYAML: "# a comment\ncpu: { enabled: true, enter: 0.92, exit: 0.85, hard: 1.10, breach_duration: 750ms }\nrules:\n  metrics: { enabled: false }\n",
	})
	require.NoError(t, err)
	ret, err := confmap.NewRetrievedFromYAML(b)
	require.NoError(t, err, string(b))
	conf, err := ret.AsConf()
	require.NoError(t, err, string(b))
	assert.Equal(t, 0.92, conf.Get("extensions::throttle::cpu::enter"), string(b))
	assert.Equal(t, false, conf.Get("extensions::throttle::rules::metrics::enabled"))
	assert.False(t, conf.IsSet("extensions::throttle::memory"), "the benchmark thresholds are replaced")
	assert.Equal(t, []any{map[string]any{"id": "throttle"}}, conf.Get("receivers::otlp::protocols::http::middlewares"))
}

// TestExpandThrottleConfigs: with several -throttle-config files, each
// throttle scenario runs once per file, named after it, so that candidate
// settings are compared within one run; with one file the names stay.
func TestExpandThrottleConfigs(t *testing.T) {
	dir := t.TempDir()
	held, wait := filepath.Join(dir, "held.yaml"), filepath.Join(dir, "wait.yaml")
	require.NoError(t, os.WriteFile(held, []byte("hold: { max_requests: 1024 }\n"), 0o600))
	require.NoError(t, os.WriteFile(wait, []byte("admission: { wait_timeout: 0s }\n"), 0o600))
	f := func(files string, wantNames, wantYAML []string) {
		t.Helper()
		cfgs, err := readThrottleConfigs(files)
		require.NoError(t, err)
		got, err := expandScenarios(options{scenarios: "A,D", factors: "3,4", thresholds: "default", throttleConfigs: cfgs})
		require.NoError(t, err)
		var names, yamls []string
		for _, s := range got {
			names, yamls = append(names, s.name), append(yamls, s.throttleYAML)
		}
		assert.Equal(t, wantNames, names)
		assert.Equal(t, wantYAML, yamls)
	}
	h, w := "hold: { max_requests: 1024 }\n", "admission: { wait_timeout: 0s }\n"
	f(held+","+wait, []string{"A", "D@3x+held", "D@3x+wait", "D@4x+held", "D@4x+wait"}, []string{"", h, w, h, w})
	f(held, []string{"A", "D@3x", "D@4x"}, []string{"", h, h})
	f("", []string{"A", "D@3x", "D@4x"}, []string{"", "", ""})

	_, err := readThrottleConfigs(filepath.Join(dir, "missing.yaml"))
	require.Error(t, err)
	require.NoError(t, os.Mkdir(filepath.Join(dir, "b"), 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "b", "held.yaml"), []byte("{}\n"), 0o600))
	_, err = readThrottleConfigs(held + "," + filepath.Join(dir, "b", "held.yaml"))
	assert.ErrorContains(t, err, `two files named "held"`)
}
