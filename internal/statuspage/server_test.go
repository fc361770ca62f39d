// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/confignet"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

func serverConfig(endpoint string) Config {
	return Config{ServerConfig: confighttp.ServerConfig{NetAddr: confignet.AddrConfig{Endpoint: endpoint, Transport: confignet.TransportTypeTCP}}}
}

func TestServerLifecycle(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	core, logs := observer.New(zapcore.InfoLevel)
	set := componenttest.NewNopTelemetrySettings()
	set.Logger = zap.New(core)
	ctx := context.Background()

	s := NewServer(serverConfig("127.0.0.1:0"), set, NewRing(4), testInfo, nil)
	assert.Nil(t, s.addr(), "nothing listens before Start")
	require.NoError(t, s.Shutdown(ctx), "Shutdown without Start")

	require.NoError(t, s.Start(ctx, componenttest.NewNopHost()))
	addr := s.addr()
	require.NotNil(t, addr)
	listening := logs.FilterMessage("throttle status page listening").All()
	require.Len(t, listening, 1)
	assert.Equal(t, addr.String(), listening[0].ContextMap()["endpoint"])

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get("http://" + addr.String() + "/status")
	require.NoError(t, err)
	var doc struct {
		Source string `json:"source"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, testInfo().Source, doc.Source)
	tr.CloseIdleConnections()

	require.NoError(t, s.Shutdown(ctx))
	assert.Nil(t, s.addr())
	require.NoError(t, s.Shutdown(ctx), "a second Shutdown")
	conn, err := net.DialTimeout("tcp", addr.String(), 5*time.Second)
	if err == nil {
		_ = conn.Close()
	}
	require.Error(t, err, "the port is still open after Shutdown")
	assert.Zero(t, logs.FilterMessage("throttle status page stopped serving").Len())
}

// A nil host (no extensions to look middlewares up in) is accepted.
func TestServerNilHost(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	s := NewServer(serverConfig("127.0.0.1:0"), componenttest.NewNopTelemetrySettings(), nil, nil, nil)
	require.NoError(t, s.Start(context.Background(), nil))
	require.NotNil(t, s.addr())
	require.NoError(t, s.Shutdown(context.Background()))
}

func TestServerEndpointInUse(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	s := NewServer(serverConfig(busy.Addr().String()), componenttest.NewNopTelemetrySettings(), nil, nil, nil)
	require.Error(t, s.Start(context.Background(), componenttest.NewNopHost()))
	assert.Nil(t, s.addr(), "nothing is left running")
	require.NoError(t, s.Shutdown(context.Background()))
}

// addr is the bound address, or nil when the server is not running.
func (s *Server) addr() net.Addr {
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}
