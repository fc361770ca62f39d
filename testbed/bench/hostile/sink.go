// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"net"
	"sync/atomic"

	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // the gateway's otlp_grpc exporter compresses with gzip

	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// sink is where the gateway's otlp_grpc exporter delivers: a gRPC server in
// the harness that takes every OTLP Export (any service) and answers it
// with an empty response (a valid Export*ServiceResponse) without decoding
// it. A stock collector as sink would decode everything on the machine's
// second core, which the clients and the hostile peer need; this one costs
// a gzip decompression per batch.
type sink struct {
	srv      *grpc.Server
	ln       net.Listener
	messages atomic.Int64
	bytes    atomic.Int64
}

// sinkMaxMessage lets the sink take the largest batch a hostile body can
// become (a 16 MiB span and what the batch processor adds to it): a
// refused export would be retried by the gateway and cost it memory that
// is not the hostile peer's doing.
const sinkMaxMessage = 256 << 20

func startSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{ln: ln}
	s.srv = grpc.NewServer(
		grpc.ForceServerCodecV2(loadgen.RawCodec{}),
		grpc.MaxRecvMsgSize(sinkMaxMessage),
		grpc.UnknownServiceHandler(s.handle),
	)
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// Addr is the sink's host:port.
func (s *sink) Addr() string { return s.ln.Addr().String() }

func (s *sink) handle(_ any, stream grpc.ServerStream) error {
	var msg []byte
	if err := stream.RecvMsg(&msg); err != nil {
		return err
	}
	s.messages.Add(1)
	s.bytes.Add(int64(len(msg)))
	empty := []byte{}
	return stream.SendMsg(&empty)
}

func (s *sink) stop() { s.srv.Stop() }
