// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package middleware is the throttle at the receivers' entrance: an HTTP
// handler wrapper and gRPC server options (a tap handle, a stats handler and
// two interceptors) that classify each request by signal, hand it to the
// admission (internal/admission), which decides it and bounds the bytes it
// holds, and answer a refusal in a way the OTLP clients retry: HTTP 429 +
// Retry-After + an OTLP google.rpc.Status body, or gRPC RESOURCE_EXHAUSTED +
// RetryInfo, before the request body or message is read.
//
// It holds no collector types: the extension builds an HTTP and a GRPC value
// per receiver server from a Config and hands the wrapper and the server
// options to confighttp and configgrpc.
//
// gRPC caveat: grpc-go accepts only one grpc.InTapHandle per server (a second
// one panics at server construction), so no other middleware installing a tap
// can be combined with this one on the same server. Tap refusals do not show
// in the gRPC server's own metrics; the extension's throttle_requests counter
// is the only record of them.
package middleware // import "github.com/otelthrottle/throttle/internal/middleware"
