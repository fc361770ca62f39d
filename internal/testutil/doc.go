// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package testutil holds the fakes that several of this repository's test
// packages use: a resource source whose readings a test sets, a manual clock
// and a host that records component status events. It imports neither the
// sampler nor the decision package, so that their own tests can use it too,
// and nothing heavier than the collector's component package, so that it
// adds little to a test binary.
package testutil // import "github.com/otelthrottle/throttle/internal/testutil"
