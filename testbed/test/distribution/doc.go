// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package distribution holds the smoke test of the real otelcol-throttle
// distribution: it builds builder-config.yaml with ocb (cached by content
// under the user's cache folder), validates every example config, runs the
// binary on free ports, sends OTLP over HTTP and gRPC, scrapes the collector's
// own metrics for the throttle series and stops it with SIGTERM.
//
// Its tests carry the build tag e2e: they run with `make e2e` and alone
// with `make smoke`. Set OTELCOL_THROTTLE_BINARY to test a binary built
// elsewhere instead of building one.
package distribution // import "github.com/otelthrottle/throttle/testbed/test/distribution"
