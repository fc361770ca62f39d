// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// gatewayConfig fills the gateway's collector configuration.
type gatewayConfig struct {
	HTTPPort, GRPCPort, MetricsPort int
	// SinkAddr is the sink's host:port.
	SinkAddr string
	// Throttle is the throttle's settings (YAML); "": none, its shipped
	// defaults.
	Throttle string
}

// gatewayTmpl is the gateway under test: the otlp receiver with the
// throttle on its gRPC and HTTP servers, the throttle with its shipped
// defaults (no setting at all) unless a scenario's gateway sets some,
// otlp -> batch -> otlp_grpc to the sink for every signal.
var gatewayTmpl = colconfig.New("gateway", `# Written by bench/hostile: the gateway under test.
extensions:
{{- if .Throttle }}
  throttle:
{{ indent 4 .Throttle }}
{{- else }}
  throttle: {}   # the shipped defaults
{{- end }}

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{{ .GRPCPort }}
        middlewares: [{ id: throttle }]
      http:
        endpoint: 127.0.0.1:{{ .HTTPPort }}
        middlewares: [{ id: throttle }]

processors:
  batch: {}

exporters:
  otlp_grpc:
    endpoint: {{ .SinkAddr }}
    tls: { insecure: true }

service:
  extensions: [throttle]
  pipelines:
    traces: { receivers: [otlp], processors: [batch], exporters: [otlp_grpc] }
    metrics: { receivers: [otlp], processors: [batch], exporters: [otlp_grpc] }
    logs: { receivers: [otlp], processors: [batch], exporters: [otlp_grpc] }
`+colconfig.Telemetry("normal"))

// gateway is one round's running gateway: its cgroup, and the collector
// with the scraper of its own metrics.
type gateway struct {
	cfg      gatewayConfig
	cg       *harness.Cgroup
	col      *harness.Collector
	httpURL  string
	grpcAddr string
}

// startGateway starts the gateway of a round named name with settings gw
// in its own cgroup and waits until its metrics and both OTLP ports answer.
func startGateway(ctx context.Context, o *options, name, sinkAddr string, gw gatewaySettings) (_ *gateway, err error) {
	ports, err := harness.FreePorts(3)
	if err != nil {
		return nil, err
	}
	g := &gateway{cfg: gatewayConfig{HTTPPort: ports[0], GRPCPort: ports[1], MetricsPort: ports[2], SinkAddr: sinkAddr, Throttle: gw.throttle}}
	g.httpURL = fmt.Sprintf("http://127.0.0.1:%d", g.cfg.HTTPPort)
	g.grpcAddr = fmt.Sprintf("127.0.0.1:%d", g.cfg.GRPCPort)
	cfg, err := colconfig.Render(gatewayTmpl, g.cfg)
	if err != nil {
		return nil, err
	}
	// The branch's name in the cgroup's, so that a leftover is found.
	if g.cg, err = harness.CreateCgroup(fmt.Sprintf("hostile-%d-%s", os.Getpid(), name), gw.cpus, gw.memMiB<<20); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			g.stop()
		}
	}()
	g.col, err = harness.StartCollector(ctx, harness.CollectorConfig{
		Process: harness.ProcessConfig{
			Bin: o.bin, Cgroup: g.cg, LogPath: filepath.Join(o.out, "log-"+name+".txt"),
			// Restarted as a kubelet would, so that an OOM kill shows as a
			// restart and the round goes on.
			Restart: true, RestartDelay: time.Second, Logf: logf,
		},
		Config: cfg, ConfigPath: filepath.Join(o.out, "config-"+name+".yaml"), MetricsPort: g.cfg.MetricsPort,
		ReadyTimeout: 60 * time.Second, ScrapeEvery: o.interval, StopGrace: 10 * time.Second,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the gateway: %w", err)
	}
	for _, port := range []int{g.cfg.HTTPPort, g.cfg.GRPCPort} {
		if err := waitListening(ctx, port, 30*time.Second); err != nil {
			return nil, err
		}
	}
	return g, nil
}

// waitListening waits until 127.0.0.1:port accepts a connection.
func waitListening(ctx context.Context, port int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the gateway does not listen on %s: %w", addr, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// budgetLimit returns the gateway's admission budget from its metrics, 0
// when not known yet.
func (g *gateway) budgetLimit() int64 {
	samples, _ := g.col.Scraper.Get()
	v, ok := harness.Sum(samples, "otelcol_throttle_inflight_bytes", map[string]string{"budget": "limit"})
	if !ok {
		return 0
	}
	return int64(v)
}

// stop stops the gateway (by its PID), kills anything left in its cgroup
// and removes the cgroup.
func (g *gateway) stop() {
	if g.col != nil {
		g.col.Stop()
	}
	if g.cg != nil {
		g.cg.Remove(logf)
	}
}
