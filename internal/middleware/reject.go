// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"mime"
	"net/http"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/otelthrottle/throttle/internal/decision"
)

const (
	pbContentType   = "application/x-protobuf"
	jsonContentType = "application/json"
)

// rejectMessage is the google.rpc.Status message of a rejection; it names the
// telemetry reason so a client log line can be matched to the counter.
func rejectMessage(v decision.Verdict) string {
	return "throttle: collector overloaded (" + v.Reason() + ")"
}

// httpBodies holds the encoded Status bodies, computed once: the rejection
// path should be much cheaper than admitting, so nothing is marshalled per
// request. Index [verdict][0 = JSON, 1 = protobuf].
type httpBodies [decision.NumVerdicts][2][]byte

func newHTTPBodies() *httpBodies {
	var b httpBodies
	for v := range decision.NumVerdicts {
		st := &spb.Status{
			Code:    int32(codes.ResourceExhausted),
			Message: rejectMessage(v),
		}
		js, err := protojson.Marshal(st)
		if err != nil {
			panic(err) // a fixed, valid message: cannot happen
		}
		pb, err := proto.Marshal(st)
		if err != nil {
			panic(err)
		}
		b[v][0], b[v][1] = js, pb
	}
	return &b
}

// isProtobuf reports whether the request's Content-Type asks for protobuf.
// It mirrors otlpreceiver's error handler: the media type (parameters
// ignored, case-insensitive) must be application/x-protobuf; everything
// else, including a missing or malformed Content-Type, gets JSON.
func isProtobuf(contentType string) bool {
	switch contentType {
	case pbContentType:
		return true
	case jsonContentType, "":
		return false
	}
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == pbContentType
}

// drainMax is the most unread body a rejected HTTP/1.x request may have for
// its connection to be kept: net/http reads and discards what a handler left
// unread (up to 256 KiB) so that the client can send its next request on
// the connection. A client that re-sends as soon as it is refused turns
// those reads into a load of their own; in an overloaded collector a new
// connection measured cheaper than reading a large body.
const drainMax = 64 << 10

// closeLinger is how long a connection closed after a rejection keeps its
// socket after the answer and a FIN have gone out, so that the client reads
// the 429 before the close resets the connection (the unread body makes
// the kernel answer the close with a reset, which can overtake the client's
// read of the answer while it is still sending the body). It is short: the
// socket keeps what arrives of the body in kernel memory until it closes.
const closeLinger = 100 * time.Millisecond

// drainTimeout bounds how long net/http may wait for the unread body of a
// rejection whose connection is kept: it reads that body before it writes
// the answer, and a client that sent its headers and holds its body back
// would otherwise keep the 429, its goroutine and its connection for ever.
const drainTimeout = time.Second

// boundDrain gives the drain of a kept HTTP/1.x connection's unread body at
// most drainTimeout. A body that does not come in time fails the drain, and
// net/http closes the connection after the answer. net/http sets the read
// deadline again for the connection's next request, so nothing is left to
// clear.
func boundDrain(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 1 || r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return
	}
	d := time.Now().Add(drainTimeout)
	if rd, ok := w.(interface{ SetReadDeadline(time.Time) error }); ok {
		_ = rd.SetReadDeadline(d) // net/http's own writer: no controller to allocate
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(d)
}

// closesConnection reports whether the rejection of r closes its connection
// instead of keeping it: an HTTP/1.x request in Open (a flood should not
// keep idle sockets and their buffers alive), or a plaintext one whose body
// may have more than drainMax left unread (a length above it, or unknown:
// chunked, or compressed, whose length confighttp drops). Over TLS the
// client's next connection costs the collector a handshake, more than the
// read. Never on HTTP/2: a connection there carries other streams.
func closesConnection(r *http.Request, v decision.Verdict) bool {
	if r.ProtoMajor != 1 {
		return false
	}
	if v == decision.VerdictDenyOpen {
		return true
	}
	return r.TLS == nil && r.Body != nil && r.Body != http.NoBody && (r.ContentLength < 0 || r.ContentLength > drainMax)
}

// writeHTTPRejection answers 429 with Retry-After and the Status body in the
// request's encoding, without touching the request body, and with
// "Connection: close" when the connection is to be closed (closeConn).
//
// The answer is flushed (with an explicit Content-Length, so that flushing
// does not switch it to chunked encoding) before returning: a handler
// outside the middleware may block on the request body after it returns.
// confighttp's decompressor closes the request body in a deferred call for
// lz4 and x-snappy-framed, which net/http turns into a drain of up to
// 256 KiB; a client waiting for "100 Continue" before sending its body would
// otherwise never see the 429, and a slow one would see it only once its
// body had been read.
func writeHTTPRejection(w http.ResponseWriter, r *http.Request, bodies *httpBodies, v decision.Verdict, delay time.Duration, closeConn bool) {
	if v >= decision.NumVerdicts || v == decision.VerdictAdmit {
		v = decision.VerdictDenyOpen
	}
	h := w.Header()
	enc := 0
	ct := jsonContentType
	if isProtobuf(r.Header.Get("Content-Type")) {
		enc, ct = 1, pbContentType
	}
	h.Set("Content-Type", ct)
	h.Set("Retry-After", strconv.FormatInt(int64(delay/time.Second), 10))
	if closeConn {
		h.Set("Connection", "close")
	}
	body := bodies[v][enc]
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusTooManyRequests)
	_, _ = w.Write(body)
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	} else {
		// Through any wrapper that unwraps (confighttp's instrumentation).
		_ = http.NewResponseController(w).Flush()
	}
}

// closeUnread closes the connection of an answered rejection without
// reading the request body: net/http would otherwise read up to 256 KiB of
// it after the handler returns, even with "Connection: close". The answer
// is out; the write side is shut at once and the socket closed after
// closeLinger, on a timer rather than a goroutine. A writer that cannot be
// taken over (a wrapper without Unwrap) keeps net/http's behaviour.
func closeUnread(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	if cw, ok := conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	time.AfterFunc(closeLinger, func() { _ = conn.Close() })
}

// maxPrecomputedDelays bounds the table of gRPC rejections per verdict: it
// covers the default range (1 to 5 s) and any range up to a minute wide;
// delays beyond are built when drawn, which only a wider range can do.
const maxPrecomputedDelays = 61

// grpcRejections holds the gRPC rejection errors, built once per verdict
// and whole second of the retry range: a rejection in the tap runs on the
// connection's reader goroutine and should cost no marshalling. The errors
// are shared read-only (grpc-go and otlpreceiver only read them).
type grpcRejections struct {
	minS int64
	errs [decision.NumVerdicts][]error // [verdict][delay seconds - minS]
}

func newGRPCRejections(d *RetryDelay) *grpcRejections {
	minS, maxS := d.seconds()
	n := min(maxS-minS+1, maxPrecomputedDelays)
	t := &grpcRejections{minS: minS}
	for v := range decision.NumVerdicts {
		if v == decision.VerdictAdmit {
			continue
		}
		t.errs[v] = make([]error, n)
		for i := range n {
			t.errs[v][i] = grpcRejection(v, time.Duration(minS+i)*time.Second)
		}
	}
	return t
}

// get returns the rejection error of verdict v with a retry delay of delay
// (whole seconds in the range the table was built for).
func (t *grpcRejections) get(v decision.Verdict, delay time.Duration) error {
	if v < decision.NumVerdicts {
		if i := int64(delay/time.Second) - t.minS; i >= 0 && i < int64(len(t.errs[v])) {
			return t.errs[v][i]
		}
	}
	return grpcRejection(v, delay)
}

// grpcRejection returns the gRPC error of a rejection with verdict v.
func grpcRejection(v decision.Verdict, delay time.Duration) error {
	return RetryableError(rejectMessage(v), delay)
}

// RetryableError returns a RESOURCE_EXHAUSTED status error with message
// and a RetryInfo detail of delay: the OTLP exporters treat
// RESOURCE_EXHAUSTED as permanent (and drop the data) unless RetryInfo is
// present. The throttle processor refuses with it too.
func RetryableError(message string, delay time.Duration) error {
	st := status.New(codes.ResourceExhausted, message)
	withInfo, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(delay)})
	if err != nil {
		return st.Err() // cannot happen: RetryInfo always marshals
	}
	return withInfo.Err()
}
