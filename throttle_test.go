// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor

import (
	"context"
	"maps"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/extension/extensiontest"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testseam"
	"github.com/otelthrottle/throttle/internal/testutil"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// The working sets of the real throttle extension's source in tests
// (testutil.Source: no CPU used), against a fixed memory limit.
const (
	fakeMemLimit   = 1000
	fakeCalm       = 100 // 0.10 of the limit: under every memory line
	fakeOverloaded = 950 // 0.95: over mem hard (0.92), Open in one sample
	fakeShedding   = 880 // 0.88: between mem enter (0.85) and hard
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
	tel *componenttest.Telemetry
}

// startRealThrottle creates and starts a throttle extension with a 10ms
// check interval, no CPU slot, no recovery ramp, and retry_after
// [testMinRetry, testMaxRetry], plus the given configuration keys (top-level
// keys replace the defaults above). It is shut down when the test ends.
func startRealThrottle(tb testing.TB, extra ...map[string]any) *realThrottle {
	tb.Helper()
	src := testutil.NewSource(cgroup.Limits{MemLimit: fakeMemLimit})
	src.SetWorkingSet(fakeCalm)

	f := testseam.ExtensionFactory(src)
	cfg := f.CreateDefaultConfig()
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
	require.NoError(tb, confmap.NewFromStringMap(conf).Unmarshal(cfg))
	require.NoError(tb, confmap.Validate(cfg))

	tel := componenttest.NewTelemetry()
	set := extensiontest.NewNopSettings(f.Type())
	set.TelemetrySettings = tel.NewTelemetrySettings()
	ext, err := f.Create(context.Background(), set, cfg)
	require.NoError(tb, err)
	th, ok := ext.(throttleapi.Throttle)
	require.Truef(tb, ok, "the extension (%T) does not implement throttleapi.Throttle", ext)
	require.NoError(tb, ext.Start(context.Background(), componenttest.NewNopHost()))
	tb.Cleanup(func() {
		require.NoError(tb, ext.Shutdown(context.Background()))
		require.NoError(tb, tel.Shutdown(context.Background()))
	})
	rt := &realThrottle{Throttle: th, ext: ext, src: src, tel: tel}
	rt.waitState(tb, decision.Normal)
	return rt
}

// host returns a host holding the extension under the processor's default
// extension ID.
func (rt *realThrottle) host() component.Host {
	return hostWith(defaultExtensionID, rt.ext)
}

// overload puts every signal in Open (one sample over mem hard) and waits
// until the traces state machine says so.
func (rt *realThrottle) overload(tb testing.TB) {
	tb.Helper()
	rt.src.SetWorkingSet(fakeOverloaded)
	rt.waitState(tb, decision.Open)
}

// calm brings the memory level under every line and waits for Normal.
func (rt *realThrottle) calm(tb testing.TB) {
	tb.Helper()
	rt.src.SetWorkingSet(fakeCalm)
	rt.waitState(tb, decision.Normal)
}

func (rt *realThrottle) waitState(tb testing.TB, want decision.State) {
	tb.Helper()
	require.Eventually(tb, func() bool {
		for s := range decision.Profiles + 1 {
			if rt.State(s) != want {
				return false
			}
		}
		return true
	}, 10*time.Second, 5*time.Millisecond, "waiting for every signal to be %v", want)
}
