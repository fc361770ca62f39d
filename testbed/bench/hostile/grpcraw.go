// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding/gzip"

	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// tracesMethod is the OTLP trace Export RPC: every client and peer of this
// benchmark sends traces, so that the hostile peer contends with the normal
// clients for the same signal's budget and learnt sizes.
const tracesMethod = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"

// unaryDesc is the stream of a unary call: one message each way.
var unaryDesc = &grpc.StreamDesc{}

// dialGRPC opens a gRPC client connection to target from the loopback
// address src (the gateway tells peers apart by their address), without
// retries or proxy, sending with the raw codec and gzip, as the OTLP
// exporters compress by default.
func dialGRPC(src netip.Addr, target string) (*grpc.ClientConn, error) {
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0))}
	return grpc.NewClient("passthrough:///"+target,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}),
		grpc.WithDisableRetry(),
		grpc.WithNoProxy(),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(loadgen.RawCodec{}), grpc.UseCompressor(gzip.Name)),
	)
}

// prepare encodes and compresses msg once, for any number of calls on
// conn: grpc-go would otherwise gzip it again for every call, which for the
// inflated message is megabytes of zeros per call in the harness's CPU.
// It opens a stream only to learn the call's codec and compressor and
// cancels it before anything is sent but its headers.
func prepare(ctx context.Context, conn *grpc.ClientConn, msg []byte) (*grpc.PreparedMsg, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := conn.NewStream(ctx, unaryDesc, "/throttle.bench.Hostile/Prepare")
	if err != nil {
		return nil, err
	}
	pm := &grpc.PreparedMsg{}
	if err := pm.Encode(s, &msg); err != nil {
		return nil, err
	}
	return pm, nil
}

// callPrepared makes one trace Export call (tracesMethod) with a prepared
// message and returns the response's error status (nil: OK).
func callPrepared(ctx context.Context, conn *grpc.ClientConn, pm *grpc.PreparedMsg) error {
	return callAfter(ctx, conn, pm, func() {}, nil)
}

// callAfter is callPrepared with its message held back: once the call is
// open (its headers sent) it calls opened, and sends the message when send
// is closed (at once for a nil send).
func callAfter(ctx context.Context, conn *grpc.ClientConn, pm *grpc.PreparedMsg, opened func(), send <-chan struct{}) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := conn.NewStream(ctx, unaryDesc, tracesMethod)
	opened()
	if err != nil {
		return err
	}
	if send != nil {
		select {
		case <-send:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := s.SendMsg(pm); err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	var resp []byte
	return s.RecvMsg(&resp)
}
