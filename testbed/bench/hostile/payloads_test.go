// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"

	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

func gunzip(t *testing.T, b []byte) []byte {
	t.Helper()
	r, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	return out
}

// The hostile bodies are valid OTLP, so that the gateway spends on them
// what it spends on real data: decoding and exporting.
func TestBlobRequestIsValidOTLP(t *testing.T) {
	for _, size := range []int{200, 1000, 130_000, 1 << 20} {
		blob := blobForSize(size)
		body := append(blobRequestPrefix(blob), bytes.Repeat([]byte{'a'}, blob)...)
		assert.GreaterOrEqual(t, len(body), size)
		assert.LessOrEqual(t, len(body), size+1, "a varint length grows by a byte at most")
		req := ptraceotlp.NewExportRequest()
		require.NoError(t, req.UnmarshalProto(body), "size %d", size)
		spans := req.Traces().ResourceSpans().At(0).ScopeSpans().At(0).Spans()
		require.Equal(t, 1, spans.Len())
		v, ok := spans.At(0).Attributes().Get("blob")
		require.True(t, ok)
		assert.Len(t, v.Str(), blob)
	}
}

func TestGzipBlobRequestInflates(t *testing.T) {
	const decoded = 4 << 20
	b, err := gzipBlobRequest(decoded)
	require.NoError(t, err)
	assert.Less(t, len(b), decoded/500, "gzip shrinks the repeated letters about a thousand times")
	body := gunzip(t, b)
	assert.GreaterOrEqual(t, len(body), decoded)
	req := ptraceotlp.NewExportRequest()
	require.NoError(t, req.UnmarshalProto(body))
	assert.Equal(t, 1, req.Traces().SpanCount())
}

// The inflated gRPC message decodes (its bulk is an unknown field the
// decoder skips) and is about a thousand times its gzip'd size.
func TestInflatedMessage(t *testing.T) {
	msg := inflatedMessage(4_000_000)
	assert.InDelta(t, 4_000_000, len(msg), 16)
	assert.Less(t, len(msg), 4<<20, "under grpc-go's default receive limit")
	wire := gzipSize(msg)
	assert.Greater(t, len(msg)/wire, 900, "decodes about 1000x larger: %d from %d", len(msg), wire)
	req := ptraceotlp.NewExportRequest()
	require.NoError(t, req.UnmarshalProto(msg))
	assert.Equal(t, 1, req.Traces().SpanCount())
}

// The trickle stream's head decompresses to the whole fill at once, and
// every piece to one more byte.
func TestTrickleStream(t *testing.T) {
	const fill = 1 << 20
	s, err := buildTrickle(fill, 3)
	require.NoError(t, err)
	require.Len(t, s.pieces, 3)
	assert.Less(t, len(s.head), fill/500)
	pr, pw := io.Pipe()
	r := make(chan *gzip.Reader, 1)
	go func() {
		zr, err := gzip.NewReader(pr)
		assert.NoError(t, err)
		r <- zr
	}()
	_, err = pw.Write(s.head)
	require.NoError(t, err)
	zr := <-r
	got, err := io.ReadFull(zr, make([]byte, fill))
	require.NoError(t, err)
	assert.Equal(t, fill, got)
	for _, p := range s.pieces {
		assert.Less(t, len(p), 16)
		go func() { _, _ = pw.Write(p) }()
		n, err := io.ReadFull(zr, make([]byte, 1))
		require.NoError(t, err)
		assert.Equal(t, 1, n)
	}
}

// wireSizes records the sizes of the messages a gRPC server receives.
type wireSizes struct {
	mu                 sync.Mutex
	decoded, onTheWire int
}

func (*wireSizes) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (*wireSizes) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (*wireSizes) HandleConn(context.Context, stats.ConnStats) {}
func (w *wireSizes) HandleRPC(_ context.Context, s stats.RPCStats) {
	if in, ok := s.(*stats.InPayload); ok {
		w.mu.Lock()
		w.decoded, w.onTheWire = in.Length, in.CompressedLength
		w.mu.Unlock()
	}
}

// grpcStub serves a gRPC server that answers every call with an empty
// message and records the sizes of the messages it receives in ws, and
// returns a connection to it from the hostile peer's address.
func grpcStub(t *testing.T, ws *wireSizes) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer(grpc.ForceServerCodecV2(loadgen.RawCodec{}), grpc.StatsHandler(ws),
		grpc.UnknownServiceHandler(func(_ any, s grpc.ServerStream) error {
			var m []byte
			if err := s.RecvMsg(&m); err != nil {
				return err
			}
			empty := []byte{}
			return s.SendMsg(&empty)
		}))
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := dialGRPC(hostileAddr, ln.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return conn
}

// A prepared message goes out gzip'd, as the gateway must see the inflated
// one: a few KiB on the wire, megabytes once decoded.
func TestPreparedMessageIsCompressed(t *testing.T) {
	ws := &wireSizes{}
	conn := grpcStub(t, ws)
	msg := inflatedMessage(4_000_000)
	pm, err := prepare(t.Context(), conn, msg)
	require.NoError(t, err)
	for range 2 { // the prepared message is sent any number of times
		require.NoError(t, callPrepared(t.Context(), conn, pm))
		ws.mu.Lock()
		assert.Equal(t, len(msg), ws.decoded)
		assert.Less(t, ws.onTheWire, 8<<10)
		ws.mu.Unlock()
	}
}
