// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"text/template"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// gatewayConfig fills the gateway's collector configuration.
type gatewayConfig struct {
	HTTPPort, GRPCPort, MetricsPort int
	// SinkAddr is the sink's host:port.
	SinkAddr string
}

// gatewayTmpl is the gateway under test: the otlp receiver with the
// throttle on its gRPC and HTTP servers, the throttle with its shipped
// defaults (no setting at all), otlp -> batch -> otlp_grpc to the sink for
// every signal.
var gatewayTmpl = template.Must(template.New("gateway").Parse(`# Written by bench/hostile: the gateway under test.
extensions:
  throttle: {}   # the shipped defaults

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
  telemetry:
    logs:
      level: info
    metrics:
      level: normal
      readers:
        - pull:
            exporter:
              prometheus:
                host: 127.0.0.1
                port: {{ .MetricsPort }}
                without_scope_info: true
                without_units: true
                without_type_suffix: true
`))

// gateway is one round's running gateway: its cgroup, its process and the
// scraper of its own metrics.
type gateway struct {
	cfg      gatewayConfig
	cg       *harness.Cgroup
	cgName   string
	proc     *harness.Process
	scr      *harness.Scraper
	stopScr  context.CancelFunc
	scrDone  chan struct{}
	httpURL  string
	grpcAddr string
}

// startGateway starts the gateway of a round named name in its own cgroup
// and waits until its metrics and both OTLP ports answer.
func startGateway(ctx context.Context, o *options, name, sinkAddr string) (_ *gateway, err error) {
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = harness.FreePort(); err != nil {
			return nil, err
		}
	}
	g := &gateway{cfg: gatewayConfig{HTTPPort: ports[0], GRPCPort: ports[1], MetricsPort: ports[2], SinkAddr: sinkAddr}}
	g.httpURL = fmt.Sprintf("http://127.0.0.1:%d", g.cfg.HTTPPort)
	g.grpcAddr = fmt.Sprintf("127.0.0.1:%d", g.cfg.GRPCPort)
	var b bytes.Buffer
	if err := gatewayTmpl.Execute(&b, g.cfg); err != nil {
		return nil, err
	}
	cfgPath, _ := filepath.Abs(filepath.Join(o.out, "config-"+name+".yaml"))
	if err := os.WriteFile(cfgPath, b.Bytes(), 0o644); err != nil {
		return nil, err
	}
	// The branch's name in the cgroup's, so that a leftover is found.
	g.cgName = fmt.Sprintf("hostile-%d-%s", os.Getpid(), name)
	if g.cg, err = harness.CreateCgroup(g.cgName, o.cpus, o.memMiB<<20); err != nil {
		return nil, fmt.Errorf("creating cgroup %s: %w", g.cgName, err)
	}
	defer func() {
		if err != nil {
			g.stop()
		}
	}()
	g.proc, err = harness.StartProcess(harness.ProcessConfig{
		Bin: o.bin, Args: []string{"--config", cfgPath}, Cgroup: g.cg,
		LogPath: filepath.Join(o.out, "log-"+name+".txt"),
		// Restarted as a kubelet would, so that an OOM kill shows as a
		// restart and the round goes on.
		Restart: true, RestartDelay: time.Second, Logf: logf,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the gateway: %w", err)
	}
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", g.cfg.MetricsPort)
	if err := harness.WaitReady(ctx, metricsURL, 60*time.Second); err != nil {
		return nil, err
	}
	for _, port := range []int{g.cfg.HTTPPort, g.cfg.GRPCPort} {
		if err := waitListening(ctx, port, 30*time.Second); err != nil {
			return nil, err
		}
	}
	g.scr = harness.NewScraper(metricsURL)
	var sctx context.Context
	sctx, g.stopScr = context.WithCancel(context.Background())
	g.scrDone = make(chan struct{})
	go func() { defer close(g.scrDone); g.scr.Run(sctx, o.interval) }()
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
	samples, _ := g.scr.Get()
	v, ok := harness.Sum(samples, "otelcol_throttle_inflight_bytes", map[string]string{"budget": "limit"})
	if !ok {
		return 0
	}
	return int64(v)
}

// stop stops the gateway (by its PID), kills anything left in its cgroup
// and removes the cgroup.
func (g *gateway) stop() {
	if g.stopScr != nil {
		g.stopScr()
		<-g.scrDone
	}
	if g.proc != nil {
		g.proc.Stop(10 * time.Second)
	}
	if g.cg != nil {
		for _, pid := range g.cg.Pids() {
			logf("killing leftover pid %d in %s", pid, g.cgName)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if err := g.cg.Destroy(); err != nil {
			logf("removing cgroup %s: %v", g.cgName, err)
		}
	}
}
