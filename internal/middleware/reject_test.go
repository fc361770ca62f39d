// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/otelthrottle/throttle/internal/decision"
)

// TestHTTPOpenKeepsHTTP2Connection: in Open an HTTP/2 client keeps its
// connection across rejections. "Connection: close" is for HTTP/1.x: Go's
// HTTP/2 server turns it into a GOAWAY, which would end every other stream
// the client multiplexes on that connection.
func TestHTTPOpenKeepsHTTP2Connection(t *testing.T) {
	f := newHTTPFixture(t, 0)
	f.dec.set(decision.SignalTraces, decision.VerdictDenyOpen)
	srv := httptest.NewUnstartedServer(f.h)
	var conns atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	c := srv.Client()
	for range 3 {
		resp, err := c.Post(srv.URL+"/v1/traces", "application/json", strings.NewReader("{}"))
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 2, resp.ProtoMajor)
		assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	}
	assert.EqualValues(t, 1, conns.Load(), "the rejections closed the HTTP/2 connection")

	// HTTP/1.1 over the same server: closed after the rejection.
	tlsConf := c.Transport.(*http.Transport).TLSClientConfig.Clone()
	tlsConf.NextProtos = []string{"http/1.1"}
	tr := &http.Transport{TLSClientConfig: tlsConf}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Post(srv.URL+"/v1/traces", "application/json", strings.NewReader("{}"))
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 1, resp.ProtoMajor)
	assert.True(t, resp.Close, "Connection: close on HTTP/1.1")
}

// TestGRPCRejectionTable: every precomputed rejection carries its verdict's
// message and its own delay, also beyond the table.
func TestGRPCRejectionTable(t *testing.T) {
	for _, r := range []struct{ lo, hi time.Duration }{{0, 30 * time.Second}, {5 * time.Second, 200 * time.Second}} {
		tab := newGRPCRejections(NewRetryDelay(r.lo, r.hi, nil, nil))
		for _, v := range []decision.Verdict{decision.VerdictDenyShed, decision.VerdictDenyOpen, decision.VerdictDenyBudget} {
			for d := r.lo; d <= r.hi; d += time.Second {
				st, ok := status.FromError(tab.get(v, d))
				require.True(t, ok)
				assert.Equal(t, codes.ResourceExhausted, st.Code())
				assert.Equal(t, rejectMessage(v), st.Message())
				require.Len(t, st.Details(), 1)
				assert.Equal(t, d, st.Details()[0].(*errdetails.RetryInfo).GetRetryDelay().AsDuration())
			}
		}
	}
}

// TestGRPCRejectAllocs: a refusal in the tap, which runs on the
// connection's reader goroutine, builds nothing: the decision allocates
// nothing and its status is shared.
func TestGRPCRejectAllocs(t *testing.T) {
	a := newAdm(t, 1<<20, withDefaultShare())
	a.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	mw := newGRPCMiddleware(t, a)
	ctx := context.WithValue(context.Background(), peerKey{}, netip.MustParseAddr("127.0.0.1"))
	info := &tap.Info{FullMethodName: traceExport}
	if allocs := testing.AllocsPerRun(1000, func() {
		if _, err := mw.tap(ctx, info); err == nil {
			t.Fatal("admitted")
		}
	}); allocs != 0 {
		t.Fatalf("a gRPC refusal allocates %v times", allocs)
	}
}
