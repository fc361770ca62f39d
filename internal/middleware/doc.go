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
// Admission budget: an HTTP request with a Content-Length reserves exactly
// that; one without (chunked, or compressed: confighttp drops the length
// when it sets up decompression) reserves Config.UnknownSize and is charged,
// before reading, for every byte it reads beyond it, so a body that outgrows
// what others leave of the budget fails with a RESOURCE_EXHAUSTED read
// error, which otlpreceiver answers 429 + Retry-After. A request larger than
// the whole budget "runs alone": it takes the whole budget (a Content-Length
// over it reserves Max; a body of unknown size that holds all of it reads on
// uncharged), so it runs only while nothing else is reserved and is bounded
// by the receiver's max_request_body_size. Refusing it instead would be a
// retryable rejection that could never succeed, and the client would retry
// until it dropped the data. A gRPC call reserves the running average of the messages
// received for its signal on that server (UnknownSize before the first one)
// and releases it on *stats.End; it is not settled to the actual size.
// Reservations are released on every path, panics included. Exempt signals
// and unclassified requests bypass the budget.
//
// gRPC caveat: grpc-go accepts only one grpc.InTapHandle per server (a second
// one panics at server construction), so no other middleware installing a tap
// can be combined with this one on the same server. Tap rejections do not show
// in the gRPC server's own metrics; the Recorder is the only record of them.
package middleware // import "github.com/otelthrottle/throttle/internal/middleware"
