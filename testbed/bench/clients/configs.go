// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"fmt"
	"strings"
	"text/template"
)

// telemetryYAML serves a collector's own metrics on 127.0.0.1 in the
// Prometheus format the harness parses ("detailed" adds the exporters'
// queue gauges); as bench/fleet's.
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

// gatewayConfig is the gateway under test: the otlp receiver with the
// throttle extension on its gRPC and HTTP servers, the batch processor and
// otlp_grpc (its default sending_queue and retry_on_failure) to the sink.
type gatewayConfig struct {
	GRPCPort, HTTPPort, MetricsPort int
	Sink                            string
	// Throttle is the extension's settings (YAML under extensions.throttle;
	// "" = {}, the shipped defaults).
	Throttle string
}

var gatewayTmpl = template.Must(template.New("gateway").Funcs(template.FuncMap{"indent": indent}).Parse(`# Written by bench/clients: the gateway under test.
extensions:
  throttle:
{{- if .Throttle }}
{{ indent 4 .Throttle }}
{{- else }} {}
{{- end }}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: "127.0.0.1:{{ .GRPCPort }}"
        middlewares: [ { id: throttle } ]
      http:
        endpoint: "127.0.0.1:{{ .HTTPPort }}"
        middlewares: [ { id: throttle } ]
processors:
  batch: {}
exporters:
  otlp_grpc:
    endpoint: "{{ .Sink }}"
    tls: { insecure: true }
service:
  extensions: [throttle]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [otlp_grpc]
` + telemetryYAML))

// agentConfig is one stock collector agent as users run it: otlp (HTTP,
// fed by the feeder) -> batch -> an OTLP exporter with its defaults (gzip,
// sending_queue, retry_on_failure) towards the gateway; as bench/fleet's.
type agentConfig struct {
	HTTPPort, MetricsPort int
	// Exporter is otlp_http or otlp_grpc; Endpoint its endpoint.
	Exporter, Endpoint string
}

var agentTmpl = template.Must(template.New("agent").Parse(`# Written by bench/clients: one agent.
receivers:
  otlp:
    protocols:
      http: { endpoint: "127.0.0.1:{{ .HTTPPort }}" }
processors:
  batch: {}
exporters:
  {{ .Exporter }}:
    endpoint: "{{ .Endpoint }}"
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

// cpuLines are CPU lines for the throttle (shares of the quota).
type cpuLines struct{ enter, exit, hard float64 }

// yaml writes the lines under the configuration names of issue 29
// (cpu.enter, ...) or, for a distribution built before the rename, the
// names it knows (thresholds.cpu.enter, ...).
func (l cpuLines) yaml(renamed bool) string {
	lines := fmt.Sprintf("{ enter: %g, exit: %g, hard: %g }", l.enter, l.exit, l.hard)
	if renamed {
		return "cpu: " + lines
	}
	return "thresholds:\n  cpu: " + lines
}
