// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage // import "github.com/otelthrottle/throttle/internal/statuspage"

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.uber.org/zap"
)

// Server is the status endpoint's HTTP server: it serves Handler on the
// configured endpoint from Start to Shutdown. It is not safe for concurrent
// use; its owner serialises Start and Shutdown.
type Server struct {
	cfg     confighttp.ServerConfig
	set     component.TelemetrySettings
	handler http.Handler

	server *http.Server
	ln     net.Listener
	wg     sync.WaitGroup
}

// NewServer returns a server for the status endpoint cfg (kept as loaded:
// ToServer fills in defaults in the copy it is given), serving
// Handler(ring, info, live, cfg's endpoint). Nothing runs until Start.
func NewServer(cfg Config, set component.TelemetrySettings, ring *Ring, info func() Info, live func() LiveStatus) *Server {
	return &Server{
		cfg:     cfg.ServerConfig,
		set:     set,
		handler: Handler(ring, info, live, cfg.NetAddr.Endpoint),
	}
}

// Start binds the endpoint and serves it on a goroutine of its own. On
// error nothing is left running. host may be nil (no server middlewares or
// authenticators are looked up then).
func (s *Server) Start(ctx context.Context, host component.Host) error {
	cfg := s.cfg
	var exts map[component.ID]component.Component
	if host != nil {
		exts = host.GetExtensions()
	}
	srv, err := cfg.ToServer(ctx, exts, s.set, s.handler)
	if err != nil {
		return err
	}
	ln, err := cfg.ToListener(ctx)
	if err != nil {
		return err
	}
	s.server, s.ln = srv, ln
	s.set.Logger.Info("throttle status page listening", zap.String("endpoint", ln.Addr().String()))
	s.wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			// The page is a diagnostic aid: losing it must not stop the
			// collector, so this is logged rather than reported as fatal.
			s.set.Logger.Error("throttle status page stopped serving", zap.Error(err))
		}
	})
	return nil
}

// Shutdown stops the server gracefully within ctx, then cuts off what is
// still in flight, and waits for the serving goroutine. Safe without Start,
// on nil, and more than once.
func (s *Server) Shutdown(ctx context.Context) error {
	if s == nil || s.server == nil {
		return nil
	}
	err := s.server.Shutdown(ctx)
	if err != nil {
		// ctx expired with requests in flight: cut them off rather than
		// leave the goroutine behind.
		err = errors.Join(err, s.server.Close())
	}
	s.wg.Wait()
	s.server, s.ln = nil, nil
	return err
}
