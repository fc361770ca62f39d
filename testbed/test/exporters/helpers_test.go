// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package exporters holds the end-to-end tests of the throttle extension
// and processor with the real OTLP exporters (otlpexporter,
// otlphttpexporter) as clients of the real otlpreceiver. They live in the
// testbed module so that the component module's go.mod carries no exporter;
// the tests with raw net/http and grpc-go clients stay next to the code
// (extension/throttleextension/e2e_test.go, the processor's tests). Only
// the components' public API is used.
package exporters

// Helpers shared by extension_test.go and processor_test.go: a throttle
// extension built by its public factory, whose water level the test drives
// through a fake resource source, a host holding it, and payloads.

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.uber.org/goleak"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testseam"
	"github.com/otelthrottle/throttle/internal/testutil"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// TestMain checks, as the components' own tests do, that no goroutine
// outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startThrottle creates the throttle extension with the extension's own
// factory, reading src, configured with conf (keys of the throttle
// configuration) and counting into tel (no-op telemetry when nil), and
// starts it; it is shut down when the test ends.
func startThrottle(tb testing.TB, src *testutil.Source, conf map[string]any, tel *componenttest.Telemetry) (component.Component, throttleapi.Throttle) {
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

// waitState waits until every signal's state machine is in want.
func waitState(tb testing.TB, th throttleapi.Throttle, want decision.State, wait time.Duration) {
	tb.Helper()
	require.Eventuallyf(tb, func() bool {
		for s := range decision.Profiles + 1 {
			if th.State(s) != want {
				return false
			}
		}
		return true
	}, wait, time.Millisecond, "waiting for every signal to be %v", want)
}

// testHost is a component.Host holding the given extensions: all that
// confighttp, configgrpc and the processor need to find the throttle.
type testHost struct {
	extensions map[component.ID]component.Component
}

func (h testHost) GetExtensions() map[component.ID]component.Component { return h.extensions }

func hostWith(id component.ID, ext component.Component) component.Host {
	return testHost{extensions: map[component.ID]component.Component{id: ext}}
}

// defaultExtensionID is the ID of the throttle extension the processor
// follows by default.
var defaultExtensionID = component.MustNewID("throttle")

// freeAddr returns a loopback address nobody listens on right now.
func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	addr := l.Addr().String()
	require.NoError(tb, l.Close())
	return addr
}
