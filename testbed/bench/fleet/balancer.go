// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"path/filepath"
	"text/template"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// balancerConfig is the tier's balancer: HAProxy in TCP mode with
// round-robin, which hands each new connection to the next replica as
// kube-proxy does, one frontend per OTLP protocol. A replica whose port
// refuses connections is taken out after two failed checks a second apart
// and back in after one good one, as a readiness probe takes a restarting
// pod out of a Service's endpoints; a connection that fails to reach a
// replica is tried on another (redispatch). The idle timeouts are long:
// kube-proxy ends no idle connection, and a gRPC agent keeps its one
// connection for as long as it can.
type balancerConfig struct {
	HTTPPort, GRPCPort int
	// Socket is the stats socket's path.
	Socket   string
	Replicas []balancerServer
}

// balancerServer is one replica as the balancer knows it.
type balancerServer struct {
	Name               string
	HTTPPort, GRPCPort int
	// Disabled starts it out of rotation (maintenance), as a pod not yet
	// in a Service's endpoints, until setReady.
	Disabled bool
}

// The backends' names in the balancer's configuration and statistics.
const (
	backendHTTP = "gateways_http"
	backendGRPC = "gateways_grpc"
)

var balancerTmpl = template.Must(template.New("haproxy").Parse(`# Written by bench/fleet (tier): the balancer in front of the replicas.
global
  maxconn 4096
  stats socket {{ .Socket }} mode 600 level admin

defaults
  mode tcp
  balance roundrobin
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  retries 2
  option redispatch
  default-server check inter 1s fall 2 rise 1

frontend otlp_http
  bind 127.0.0.1:{{ .HTTPPort }}
  default_backend ` + backendHTTP + `

frontend otlp_grpc
  bind 127.0.0.1:{{ .GRPCPort }}
  default_backend ` + backendGRPC + `

backend ` + backendHTTP + `
{{- range .Replicas }}
  server {{ .Name }} 127.0.0.1:{{ .HTTPPort }}{{ if .Disabled }} disabled{{ end }}
{{- end }}

backend ` + backendGRPC + `
{{- range .Replicas }}
  server {{ .Name }} 127.0.0.1:{{ .GRPCPort }}{{ if .Disabled }} disabled{{ end }}
{{- end }}
`))

// balancer is the running HAProxy.
type balancer struct {
	*haproxy.Proxy
	// backend is the backend of the protocol the agents use.
	backend            string
	HTTPPort, GRPCPort int
}

// startBalancer starts HAProxy (the binary bin) in front of replicas on
// fresh ports, in the foreground as a child of this process (stopped by
// PID with the group), and waits until its stats socket answers.
func (g *group) startBalancer(ctx context.Context, bin string, replicas []balancerServer) (*balancer, error) {
	ports, err := harness.FreePorts(2)
	if err != nil {
		return nil, err
	}
	cfg := balancerConfig{HTTPPort: ports[0], GRPCPort: ports[1], Replicas: replicas}
	p, err := haproxy.Start(ctx, haproxy.Config{
		Bin: bin,
		Render: func(socket string) ([]byte, error) {
			cfg.Socket = socket
			return colconfig.Render(balancerTmpl, cfg)
		},
		ConfigPath: filepath.Join(g.o.out, fmt.Sprintf("config-%s-balancer.cfg", g.name)),
		LogPath:    filepath.Join(g.o.out, fmt.Sprintf("log-%s-balancer.txt", g.name)), Logf: logf,
	})
	if err != nil {
		return nil, fmt.Errorf("the balancer: %w", err)
	}
	g.cleanups = append(g.cleanups, p.Stop)
	lb := &balancer{Proxy: p, backend: backendHTTP, HTTPPort: cfg.HTTPPort, GRPCPort: cfg.GRPCPort}
	if g.o.protocol == "grpc" {
		lb.backend = backendGRPC
	}
	return lb, nil
}

// stats reads the statistics of the agents' backend's servers, by server
// name.
func (lb *balancer) stats() (map[string]haproxy.ServerStats, error) {
	return lb.Stats(lb.backend)
}

// setReady puts the replica server into rotation in both backends, as a
// pod that turns ready joins a Service's endpoints.
func (lb *balancer) setReady(server string) error {
	for _, backend := range []string{backendHTTP, backendGRPC} {
		if err := lb.SetReady(backend, server); err != nil {
			return err
		}
	}
	return nil
}
