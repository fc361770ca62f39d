// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package colconfig

import (
	"time"
)

// Gateway kinds: what protects a gateway under test.
const (
	KindStock         = "stock"          // otelcol-stock, no protection
	KindMemoryLimiter = "memory_limiter" // otelcol-stock, memory_limiter processor first in the pipeline
	KindMLExt         = "mlext"          // otelcol-mlext (v0.159.0), memory_limiter extension as middleware
	KindThrottle      = "throttle"       // otelcol-throttle, throttle extension as middleware
)

// MemoryLimiterYAML are the memory_limiter settings of the memory_limiter
// gateways, processor and extension: the collector's documented starting
// point, and the Helm chart's.
const MemoryLimiterYAML = `check_interval: 1s
limit_percentage: 80
spike_limit_percentage: 25`

// Gateway is a gateway under test: otlp -> [memory_limiter] -> batch ->
// otlp_http to a sink, with the protection of Kind.
type Gateway struct {
	// Bench names the benchmark that writes it (bench/fleet, ...).
	Bench                           string
	Kind                            string
	HTTPPort, GRPCPort, MetricsPort int
	PprofPort                       int
	SinkHTTPPort                    int
	// Compression replaces the exporter's (gzip) when set: none sends
	// uncompressed.
	Compression string
	// ThrottleYAML replaces the throttle extension's settings (default: {}).
	ThrottleYAML string
	// Downstream turns the throttle's downstream level on, reading the
	// exporter's queue from the gateway's own metrics (MetricsPort).
	Downstream bool
	// QueueSize sets the exporter's sending_queue queue_size, in batches
	// (0: the exporter's default, 1000).
	QueueSize int
	// MemoryLimiter is the memory_limiter's settings of the memory_limiter
	// and mlext kinds (MemoryLimiterYAML).
	MemoryLimiter string
	// MaxConnectionAge, when set, makes the gRPC server end each
	// connection (GOAWAY) after it, and MaxConnectionAgeGrace (when set)
	// bounds the RPCs still running on it then: behind a connection-level
	// balancer, the client's next connection may go to another replica.
	MaxConnectionAge, MaxConnectionAgeGrace time.Duration
}

var gatewayTmpl = New("gateway", `# Written by {{ .Bench }}: the gateway under test ({{ .Kind }}).
extensions:
  pprof: { endpoint: "127.0.0.1:{{ .PprofPort }}" }
{{- if eq .Kind "throttle" }}
  throttle:
{{- if or .ThrottleYAML .Downstream }}
{{- if .ThrottleYAML }}
{{ indent 4 .ThrottleYAML }}
{{- end }}
`+DownstreamYAML+`
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
{{- if .Compression }}
    compression: {{ .Compression }}
{{- end }}
{{- if .QueueSize }}
    sending_queue:
      queue_size: {{ .QueueSize }}
{{- end }}
service:
  extensions: [pprof{{ if .Middleware }}, {{ .Middleware }}{{ end }}]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [{{ .Processors }}]
      exporters: [otlp_http]
`+Telemetry("detailed"))

// DownstreamYAML turns the throttle's downstream level on in a template
// whose data has Downstream and MetricsPort: the level reads the
// collector's own metrics, where Telemetry serves them.
const DownstreamYAML = `{{- if .Downstream }}
    downstream:
      enabled: true
      endpoint: "http://127.0.0.1:{{ .MetricsPort }}/metrics"
{{- end }}`

// Render renders the gateway's configuration.
func (c Gateway) Render() ([]byte, error) { return Render(gatewayTmpl, c) }

// Middleware is the extension the receivers reference ("" for none).
func (c Gateway) Middleware() string {
	switch c.Kind {
	case KindThrottle:
		return "throttle"
	case KindMLExt:
		return "memory_limiter"
	}
	return ""
}

// Processors is the gateway pipeline's processor list.
func (c Gateway) Processors() string {
	if c.Kind == KindMemoryLimiter {
		return "memory_limiter, batch"
	}
	return "batch"
}
