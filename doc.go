// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package throttleprocessor applies the throttle extension's per-signal
// admission decisions to batches inside a pipeline, for receivers that cannot
// take HTTP or gRPC middleware (Kafka, file logs, Prometheus scraping,
// hostmetrics...). It holds no state of its own: it asks the extension it names.
package throttleprocessor // import "github.com/otelthrottle/throttle"
