// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
)

// Gateway kinds: what protects the gateway under test.
const (
	gwStock         = "stock"          // otelcol-stock, no protection
	gwMemoryLimiter = "memory_limiter" // otelcol-stock, memory_limiter processor first in the pipeline
	gwMLExt         = "mlext"          // otelcol-mlext (v0.159.0), memory_limiter extension as middleware
	gwThrottle      = "throttle"       // otelcol-throttle, throttle extension as middleware
)

// The memory_limiter settings of both memory_limiter scenarios: the
// collector's documented starting point, and the Helm chart's.
const memoryLimiterYAML = `check_interval: 1s
limit_percentage: 80
spike_limit_percentage: 25`

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

// gatewayConfig is the gateway under test: otlp -> [memory_limiter] ->
// batch -> otlp_http to the sink, with the protection of Kind.
type gatewayConfig struct {
	Kind                            string
	HTTPPort, GRPCPort, MetricsPort int
	PprofPort                       int
	SinkHTTPPort                    int
	// ThrottleYAML replaces the throttle extension's settings (default: {}).
	ThrottleYAML  string
	MemoryLimiter string
	// MaxConnectionAge, when set, makes the gRPC server end each
	// connection (GOAWAY) after it, and MaxConnectionAgeGrace (when set)
	// bounds the RPCs still running on it then: behind a connection-level
	// balancer, the client's next connection may go to another replica.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
}

var gatewayTmpl = colconfig.New("gateway", `# Written by bench/fleet: the gateway under test ({{ .Kind }}).
extensions:
  pprof: { endpoint: "127.0.0.1:{{ .PprofPort }}" }
{{- if eq .Kind "throttle" }}
  throttle:
{{- if .ThrottleYAML }}
{{ indent 4 .ThrottleYAML }}
{{- else }} {}
{{- end }}
{{- end }}
{{- if eq .Kind "mlext" }}
  memory_limiter:
{{ indent 4 .MemoryLimiter }}
{{- end }}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: "127.0.0.1:{{ .GRPCPort }}"
{{- if .MaxConnectionAge }}
        keepalive:
          server_parameters:
            max_connection_age: {{ .MaxConnectionAge }}
{{- if .MaxConnectionAgeGrace }}
            max_connection_age_grace: {{ .MaxConnectionAgeGrace }}
{{- end }}
{{- end }}
{{- if .Middleware }}
        middlewares: [ { id: {{ .Middleware }} } ]
{{- end }}
      http:
        endpoint: "127.0.0.1:{{ .HTTPPort }}"
{{- if .Middleware }}
        middlewares: [ { id: {{ .Middleware }} } ]
{{- end }}
processors:
  batch: {}
{{- if eq .Kind "memory_limiter" }}
  memory_limiter:
{{ indent 4 .MemoryLimiter }}
{{- end }}
exporters:
  otlp_http:
    endpoint: "http://127.0.0.1:{{ .SinkHTTPPort }}"
service:
  extensions: [pprof{{ if .Middleware }}, {{ .Middleware }}{{ end }}]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [{{ .Processors }}]
      exporters: [otlp_http]
`+colconfig.Telemetry("detailed"))

// Middleware is the extension the receivers reference ("" for none).
func (c gatewayConfig) Middleware() string {
	switch c.Kind {
	case gwThrottle:
		return "throttle"
	case gwMLExt:
		return "memory_limiter"
	}
	return ""
}

// Processors is the gateway pipeline's processor list.
func (c gatewayConfig) Processors() string {
	if c.Kind == gwMemoryLimiter {
		return "memory_limiter, batch"
	}
	return "batch"
}
