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
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.uber.org/goleak"
)

// TestMain checks, as the components' own tests do, that no goroutine
// outlives the tests.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

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
