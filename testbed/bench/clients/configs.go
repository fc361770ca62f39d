// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
)

// gatewayConfig is the gateway under test: the otlp receiver with the
// throttle extension on its gRPC and HTTP servers (none on the stock
// gateway), the batch processor and otlp_grpc (its default sending_queue
// and retry_on_failure) to the sink.
type gatewayConfig struct {
	GRPCPort, HTTPPort, MetricsPort int
	Sink                            string
	// Throttle is the extension's settings (YAML under extensions.throttle;
	// "" = {}, the shipped defaults).
	Throttle string
	// Stock leaves the throttle out; Downstream turns its downstream level
	// on (reading MetricsPort); QueueSize sets the exporter's queue_size,
	// and BlockOnOverflow makes a full queue wait instead of refusing.
	Stock, Downstream bool
	QueueSize         int
	BlockOnOverflow   bool
}

var gatewayTmpl = colconfig.New("gateway", `# Written by bench/clients: the gateway under test.
{{- if not .Stock }}
extensions:
  throttle:
{{- if or .Throttle .Downstream }}
{{- if .Throttle }}
{{ indent 4 .Throttle }}
{{- end }}
`+colconfig.DownstreamYAML+`
{{- else }} {}
{{- end }}
{{- end }}
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: "127.0.0.1:{{ .GRPCPort }}"
{{- if not .Stock }}
        middlewares: [ { id: throttle } ]
{{- end }}
      http:
        endpoint: "127.0.0.1:{{ .HTTPPort }}"
{{- if not .Stock }}
        middlewares: [ { id: throttle } ]
{{- end }}
processors:
  batch: {}
exporters:
  otlp_grpc:
    endpoint: "{{ .Sink }}"
    tls: { insecure: true }
{{- if .QueueSize }}
    sending_queue:
      queue_size: {{ .QueueSize }}
{{- if .BlockOnOverflow }}
      block_on_overflow: true
{{- end }}
{{- end }}
service:
{{- if not .Stock }}
  extensions: [throttle]
{{- end }}
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [otlp_grpc]
`+colconfig.Telemetry("detailed"))

// cpuLines are CPU lines for the throttle (shares of the quota).
type cpuLines struct{ enter, exit, hard float64 }

// yaml writes the lines under today's configuration names
// (cpu.enter, ...) or, for a distribution built before the rename, the
// names it knows (thresholds.cpu.enter, ...).
func (l cpuLines) yaml(renamed bool) string {
	lines := fmt.Sprintf("{ enter: %g, exit: %g, hard: %g }", l.enter, l.exit, l.hard)
	if renamed {
		return "cpu: " + lines
	}
	return "thresholds:\n  cpu: " + lines
}
