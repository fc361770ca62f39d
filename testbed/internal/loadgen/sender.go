// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/encoding/gzip"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// sender sends one request and classifies its outcome. It never retries.
type sender interface {
	send(ctx context.Context, p *Payload) Result
	close()
}

// httpSender posts pre-encoded bodies with a plain client: no retry (the
// transport does not replay a POST), no redirect, no proxy from the
// environment, and enough idle connections for every worker so that
// connections are reused rather than churned through TIME_WAIT.
type httpSender struct {
	client   *http.Client
	target   string
	headers  http.Header
	encoding Encoding
	gzip     bool
}

func newHTTPSender(cfg Config, conns int) *httpSender {
	tr := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	return &httpSender{
		client: &http.Client{
			Transport:     tr,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		target: cfg.Target, headers: cfg.Headers, encoding: cfg.Encoding, gzip: cfg.Gzip,
	}
}

func (h *httpSender) send(ctx context.Context, p *Payload) Result {
	start := time.Now()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.target+p.Signal.httpPath(), bytes.NewReader(p.Body))
	if err != nil {
		return Result{Class: ClassError, Latency: time.Since(start)}
	}
	for k, vs := range h.headers {
		req.Header[k] = vs
	}
	if h.encoding == JSON {
		req.Header.Set("Content-Type", "application/json")
	} else {
		req.Header.Set("Content-Type", "application/x-protobuf")
	}
	if h.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return Result{Class: ClassError, Latency: time.Since(start)}
	}
	// Read the whole answer (bounded) so that the connection is reused.
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	lat := time.Since(start)
	r := Result{Code: resp.StatusCode, Latency: lat}
	switch {
	case err != nil:
		r.Class = ClassError
	case resp.StatusCode >= 200 && resp.StatusCode < 300:
		r.Class = ClassOK
		r.Accepted = p.Items - rejectedItems(p.Signal, body, h.encoding)
	case resp.StatusCode == http.StatusTooManyRequests:
		r.Class = ClassRejected
	case resp.StatusCode == http.StatusServiceUnavailable:
		r.Class = ClassUnavailable
	default:
		r.Class = ClassOther
	}
	return r
}

func (h *httpSender) close() { h.client.CloseIdleConnections() }

// rejectedItems reads the partial success of an OTLP response body.
func rejectedItems(s Signal, body []byte, enc Encoding) int {
	if len(body) == 0 {
		return 0
	}
	var n int64
	switch s {
	case Traces:
		resp := ptraceotlp.NewExportResponse()
		if unmarshalResp(resp.UnmarshalProto, resp.UnmarshalJSON, body, enc) == nil {
			n = resp.PartialSuccess().RejectedSpans()
		}
	case Metrics:
		resp := pmetricotlp.NewExportResponse()
		if unmarshalResp(resp.UnmarshalProto, resp.UnmarshalJSON, body, enc) == nil {
			n = resp.PartialSuccess().RejectedDataPoints()
		}
	case Logs:
		resp := plogotlp.NewExportResponse()
		if unmarshalResp(resp.UnmarshalProto, resp.UnmarshalJSON, body, enc) == nil {
			n = resp.PartialSuccess().RejectedLogRecords()
		}
	}
	return int(n)
}

func unmarshalResp(p, j func([]byte) error, body []byte, enc Encoding) error {
	if enc == JSON {
		return j(body)
	}
	return p(body)
}

// RawCodec is a gRPC codec of protobuf bytes encoded beforehand: it sends
// a *[]byte as it is and hands back what it receives undecoded, so that a
// client encodes each body once, not per call, and a sink counts bytes
// without decoding them.
type RawCodec struct{}

func (RawCodec) Name() string { return "proto" }

func (RawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.(*[]byte)
	if !ok {
		return nil, errors.New("loadgen.RawCodec: want *[]byte")
	}
	return mem.BufferSlice{mem.SliceBuffer(*b)}, nil
}

func (RawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	b, ok := v.(*[]byte)
	if !ok {
		return errors.New("loadgen.RawCodec: want *[]byte")
	}
	*b = data.Materialize()
	return nil
}

var _ encoding.CodecV2 = RawCodec{}

// grpcSender calls the OTLP Export methods on a few connections, with
// retries disabled (grpc-go still transparently re-sends an RPC the server
// never saw, for example one refused by a GOAWAY; that is not a retry of a
// request the collector answered).
type grpcSender struct {
	conns []*grpc.ClientConn
	next  atomic.Uint64
	md    metadata.MD
	opts  []grpc.CallOption
}

func newGRPCSender(cfg Config) (*grpcSender, error) {
	g := &grpcSender{md: metadata.MD{}}
	for k, vs := range cfg.Headers {
		g.md[strings.ToLower(k)] = vs
	}
	g.opts = []grpc.CallOption{grpc.ForceCodecV2(RawCodec{})}
	if cfg.Gzip {
		g.opts = append(g.opts, grpc.UseCompressor(gzip.Name))
	}
	for range cfg.GRPCConns {
		conn, err := grpc.NewClient(cfg.Target,
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			grpc.WithDisableRetry(),
			grpc.WithNoProxy(),
		)
		if err != nil {
			g.close()
			return nil, err
		}
		g.conns = append(g.conns, conn)
	}
	return g, nil
}

func (g *grpcSender) send(ctx context.Context, p *Payload) Result {
	conn := g.conns[g.next.Add(1)%uint64(len(g.conns))]
	if len(g.md) > 0 {
		ctx = metadata.NewOutgoingContext(ctx, g.md)
	}
	start := time.Now()
	var resp []byte
	err := conn.Invoke(ctx, p.Signal.grpcMethod(), &p.Proto, &resp, g.opts...)
	r := Result{Latency: time.Since(start)}
	if err == nil {
		r.Class, r.Code = ClassOK, int(codes.OK)
		r.Accepted = p.Items - rejectedItems(p.Signal, resp, Proto)
		return r
	}
	st, _ := status.FromError(err)
	r.Code = int(st.Code())
	r.Class = classifyGRPC(st)
	return r
}

// classifyGRPC maps a status onto a class. UNAVAILABLE is also how grpc-go
// reports a connection it could not make or lost: those are transport
// errors, told apart by grpc-go's messages.
func classifyGRPC(st *status.Status) Class {
	switch st.Code() {
	case codes.OK:
		return ClassOK
	case codes.ResourceExhausted:
		return ClassRejected
	case codes.Unavailable:
		msg := st.Message()
		for _, s := range []string{"connection error", "transport", "EOF", "connection reset", "connection refused", "error reading from server"} {
			if strings.Contains(msg, s) {
				return ClassError
			}
		}
		return ClassUnavailable
	case codes.DeadlineExceeded, codes.Canceled:
		return ClassError
	default:
		return ClassOther
	}
}

func (g *grpcSender) close() {
	for _, c := range g.conns {
		_ = c.Close()
	}
}
