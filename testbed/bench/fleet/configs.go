// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
)

// sinkConfig is the sink: it accepts everything and drops it, so that its
// receiver's accepted count is the ground truth of what was delivered.
type sinkConfig struct {
	HTTPPort, GRPCPort, MetricsPort int
}

var sinkTmpl = colconfig.New("sink", `# Written by bench/fleet: the sink.
receivers:
  otlp:
    protocols:
      grpc: { endpoint: "127.0.0.1:{{ .GRPCPort }}" }
      http: { endpoint: "127.0.0.1:{{ .HTTPPort }}" }
exporters:
  nop: {}
service:
  pipelines:
    traces: { receivers: [otlp], exporters: [nop] }
`+colconfig.Telemetry("detailed"))
