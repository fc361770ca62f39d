// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import "github.com/otelthrottle/throttle/internal/decision"

// Protocol is where a decision was made; it is the `protocol` attribute of
// the requests counter and indexes the extension's counts.
type Protocol uint8

// The protocols, usable as array indexes.
const (
	ProtocolHTTP Protocol = iota
	ProtocolGRPC
	// ProtocolProcessor is a decision of the throttle processor: the
	// middleware never records it, the extension counts it with the others.
	ProtocolProcessor
	// NumProtocols is the number of protocols; not a protocol.
	NumProtocols
)

var protocolNames = [NumProtocols]string{"http", "grpc", "processor"}

// String returns the protocol's telemetry name.
func (p Protocol) String() string {
	if p < NumProtocols {
		return protocolNames[p]
	}
	return "unknown"
}

// Recorder counts decisions. Record is called once per classified request,
// on the request path (for gRPC on the connection's reader goroutine), so it
// must not block and should not allocate: an implementation indexes
// pre-built attribute sets by (protocol, signal, verdict).
//
// Unclassified requests are not recorded: they have no signal and are never
// decided.
type Recorder interface {
	Record(p Protocol, s decision.Signal, v decision.Verdict)
}

// NopRecorder is a Recorder that counts nothing.
type NopRecorder struct{}

// Record does nothing.
func (NopRecorder) Record(Protocol, decision.Signal, decision.Verdict) {}
