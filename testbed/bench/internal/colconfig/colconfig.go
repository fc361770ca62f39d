// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package colconfig renders the collector configurations the benchmarks
// write into their results folders: the pieces they share (a collector's
// own metrics for the harness's scraper, the stock agent) and the helpers
// their templates use.
package colconfig // import "github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"

import (
	"bytes"
	"strings"
	"text/template"
)

// Telemetry is the service::telemetry block of a collector a benchmark
// starts: its own metrics on 127.0.0.1:{{ .MetricsPort }} in the
// Prometheus format the harness parses, at level ("detailed" adds the
// exporters' queue gauges). It ends a template whose data has MetricsPort.
func Telemetry(level string) string {
	return `  telemetry:
    logs:
      level: info
    metrics:
      level: ` + level + `
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
}

// New parses a configuration template that may call indent.
func New(name, text string) *template.Template {
	return template.Must(template.New(name).Funcs(template.FuncMap{"indent": Indent}).Parse(text))
}

// Render executes t with data.
func Render(t *template.Template, data any) ([]byte, error) {
	var b bytes.Buffer
	err := t.Execute(&b, data)
	return b.Bytes(), err
}

// Indent re-indents a YAML block by n spaces.
func Indent(n int, s string) string {
	pad := strings.Repeat(" ", n)
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = pad + l
	}
	return strings.Join(lines, "\n")
}

// Agent is one stock collector agent as users run it: otlp (HTTP, fed by
// a load generator or a feeder) -> batch -> an OTLP exporter with its
// defaults (gzip, sending_queue, retry_on_failure) towards the gateway.
type Agent struct {
	// Bench names the benchmark that writes it (bench/fleet, ...).
	Bench                 string
	HTTPPort, MetricsPort int
	// Exporter is otlp_http or otlp_grpc; Endpoint its endpoint.
	Exporter, Endpoint string
	// Compression replaces the exporter's (gzip) when set: none sends
	// uncompressed.
	Compression string
	// Headers are sent with every export (the exporter's headers), e.g.
	// the tenant a multi-tenant gateway tells clients apart by.
	Headers map[string]string
}

var agentTmpl = New("agent", `# Written by {{ .Bench }}: one agent.
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
{{- if .Headers }}
    headers:
{{- range $name, $value := .Headers }}
      {{ printf "%q" $name }}: {{ printf "%q" $value }}
{{- end }}
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
`+Telemetry("detailed"))

// Render renders the agent's configuration.
func (a Agent) Render() ([]byte, error) { return Render(agentTmpl, a) }
