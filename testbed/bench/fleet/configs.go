// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"strings"
	"text/template"
	"time"
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

// telemetryYAML serves a collector's own metrics on 127.0.0.1:{{.MetricsPort}}
// in the Prometheus format the harness parses; "detailed" adds the
// exporters' queue gauges.
const telemetryYAML = `  telemetry:
    logs:
      level: info
    metrics:
      level: detailed
      readers:
        - pull:
            exporter:
              prometheus:
                host: 127.0.0.1
                port: {{ .MetricsPort }}
                without_scope_info: true
                without_units: true
                without_type_suffix: true
`

// sinkConfig is the sink: it accepts everything and drops it, so that its
// receiver's accepted count is the ground truth of what was delivered.
type sinkConfig struct {
	HTTPPort, GRPCPort, MetricsPort int
}

var sinkTmpl = template.Must(template.New("sink").Parse(`# Written by bench/fleet: the sink.
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
` + telemetryYAML))

// agentConfig is one agent: a stock collector as users run it, otlp ->
// batch -> an OTLP exporter with its defaults (gzip, sending_queue,
// retry_on_failure) towards the gateway.
type agentConfig struct {
	HTTPPort, MetricsPort int
	// Exporter is otlp_http or otlp_grpc; Endpoint its endpoint.
	Exporter, Endpoint string
	// Compression replaces the exporter's (gzip) when set: none sends
	// uncompressed, where the agents' gzip would be the machine's
	// bottleneck rather than the gateway.
	Compression string
}

var agentTmpl = template.Must(template.New("agent").Parse(`# Written by bench/fleet: one agent.
receivers:
  otlp:
    protocols:
      http: { endpoint: "127.0.0.1:{{ .HTTPPort }}" }
processors:
  batch: {}
exporters:
  {{ .Exporter }}:
    endpoint: "{{ .Endpoint }}"
{{- if .Compression }}
    compression: {{ .Compression }}
{{- end }}
{{- if eq .Exporter "otlp_grpc" }}
    tls: { insecure: true }
{{- end }}
service:
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [{{ .Exporter }}]
` + telemetryYAML))

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

var gatewayTmpl = template.Must(template.New("gateway").Funcs(template.FuncMap{"indent": indent}).Parse(`# Written by bench/fleet: the gateway under test ({{ .Kind }}).
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
` + telemetryYAML))

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

func render(t *template.Template, data any) ([]byte, error) {
	var b bytes.Buffer
	err := t.Execute(&b, data)
	return b.Bytes(), err
}

// indent re-indents a YAML block by n spaces.
func indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = pad + l
	}
	return strings.Join(lines, "\n")
}
