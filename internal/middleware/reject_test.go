package middleware

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// TestHTTPOpenKeepsHTTP2Connection: in Open an HTTP/2 client keeps its
// connection across rejections. "Connection: close" is for HTTP/1.x: Go's
// HTTP/2 server turns it into a GOAWAY, which would end every other stream
// the client multiplexes on that connection.
func TestHTTPOpenKeepsHTTP2Connection(t *testing.T) {
	f := newHTTPFixture(t, nil, 0, nil)
	f.dec.set(decision.Traces, decision.DenyOpen)
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
