// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package middleware is the throttle at the receivers' entrance: an HTTP
// handler wrapper and gRPC server options (a tap handle and a stats handler)
// that classify each request by signal, ask a Decider for a verdict, bound the
// bytes of admitted unfinished requests with an admission Budget, and reject
// with a retry-friendly answer (HTTP 429 + Retry-After + an OTLP
// google.rpc.Status body, or gRPC RESOURCE_EXHAUSTED + RetryInfo) before the
// request body or message is read.
//
// It holds no collector types: the extension builds an HTTP and a GRPC value
// per receiver server from a Config and hands the wrapper and the server
// options to confighttp and configgrpc.
//
// Admission budget: an admitted HTTP body first reserves what bodies of its
// signal have lately turned out to be on that server once read (and
// decompressed), or Config.UnknownSize before any, or its Content-Length if
// smaller; it is charged, before reading, for every byte beyond that. When
// the budget is full a body waits (Budget's wait, oldest first) for bytes
// to be released, then fails with a RESOURCE_EXHAUSTED read error, which
// otlpreceiver answers 429 + Retry-After. A body that holds the whole
// budget "runs alone": it reads on uncharged, bounded by the receiver's
// max_request_body_size, so a request larger than the budget is not refused
// for ever; one known to be that large asks for the whole budget when it
// first waits, which stops new admissions until it has it. Config.IdleTimeout
// keeps slow clients from holding the budget: a body older than it keeps at
// most 64 KiB reserved beyond what it has received, and one that receives
// nothing for that long fails. The admissions of one peer (remote IP) hold
// at most its share of the budget. A gRPC call reserves the largest message
// of its signal received on that server lately (UnknownSize before any),
// grows to the size of its message once that has arrived, is cancelled if
// it sends no message within IdleTimeout, and releases on *stats.End.
// Reservations are released on every path, panics included. Exempt signals
// and unclassified requests bypass the budget.
//
// gRPC caveat: grpc-go accepts only one grpc.InTapHandle per server (a second
// one panics at server construction), so no other middleware installing a tap
// can be combined with this one on the same server. Tap rejections do not show
// in the gRPC server's own metrics; the Recorder is the only record of them.
package middleware // import "github.com/otelthrottle/throttle/internal/middleware"
