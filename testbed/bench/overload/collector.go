// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"strings"
	"text/template"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
)

// colConfig fills the collector configuration of a scenario.
type colConfig struct {
	GRPCPort, HTTPPort, MetricsPort int
	// Throttle: the throttle extension on both OTLP receivers.
	Throttle bool
	// Thresholds: "default" (the shipped lines) or "benchmark" (the original
	// design's 0x08 a).
	Thresholds string
	// ThrottleYAML, when set, replaces the throttle extension's settings
	// (the lines under extensions.throttle, at any indentation): for
	// experiments such as shedding everything to measure the cost of a
	// rejection.
	ThrottleYAML string
	// MemoryLimiter: the stock memory_limiter processor first in every
	// pipeline.
	MemoryLimiter bool
	// PprofPort, when not 0: contrib's pprof extension on 127.0.0.1 at this
	// port, for the goroutine count of the timeline (-pprof).
	PprofPort int
}

// The pipeline is otlp -> [memory_limiter] -> batch -> nop: the receiver's
// decoding and the batch processor are the work under test, and the nop
// exporter keeps the sink free (an exporter to a local sink would share the
// machine's CPUs with the collector and the generator, and measure the
// sink). Metrics are exempt from throttling: the harness
// checks that they lose nothing.
var configTmpl = template.Must(template.New("config").Funcs(template.FuncMap{"split": strings.Fields, "indent": indent4}).Parse(`# Written by bench/overload; one scenario's collector.
{{- if or .Throttle .PprofPort }}
extensions:
{{- end }}
{{- if .Throttle }}
  throttle:
{{- if .ThrottleYAML }}
{{ indent .ThrottleYAML }}
{{- else if eq .Thresholds "benchmark" }}
    # The original design's benchmark thresholds (0x08 a); its EWMA
    # weights 0.95 and 0.7 at 250ms are the windows 4.874s and 700.9ms.
    check_interval: 250ms
    cpu:
      enabled: true
      enter: 0.85
      exit: 0.70
      hard: 1.20
      breach_duration: 750ms
      max_shed: 1
      slow_window: 4.874s
      fast_window: 700.9ms
      fallback_cores: 1
    memory: { enabled: true, enter: 0.70, exit: 0.60, hard: 0.80, breach_duration: 250ms }
    rules:
      default: { drop_min: 0.0, drop_max: 0.2 }
      metrics: { enabled: false }
{{- else }}
    # The defaults, metrics exempt.
    rules:
      metrics: { enabled: false }
{{- end }}
{{- end }}
{{- if .PprofPort }}
  # Go's pprof: the harness reads the goroutine count from it.
  pprof:
    endpoint: 127.0.0.1:{{ .PprofPort }}
{{- end }}

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{{ .GRPCPort }}
{{- if .Throttle }}
        middlewares: [{ id: throttle }]
{{- end }}
      http:
        endpoint: 127.0.0.1:{{ .HTTPPort }}
{{- if .Throttle }}
        middlewares: [{ id: throttle }]
{{- end }}

processors:
{{- if .MemoryLimiter }}
  memory_limiter:
    check_interval: 1s
    limit_percentage: 80
    spike_limit_percentage: 25
{{- end }}
  batch: {}

exporters:
  nop: {}

service:
{{- if or .Throttle .PprofPort }}
  extensions: [{{ if .Throttle }}throttle{{ end }}{{ if and .Throttle .PprofPort }}, {{ end }}{{ if .PprofPort }}pprof{{ end }}]
{{- end }}
  pipelines:
{{- range $p := (split "traces metrics logs") }}
    {{ $p }}:
      receivers: [otlp]
      processors: [{{ if $.MemoryLimiter }}memory_limiter, {{ end }}batch]
      exporters: [nop]
{{- end }}
` + colconfig.Telemetry("normal")))

func renderConfig(c colConfig) ([]byte, error) {
	var b bytes.Buffer
	err := configTmpl.Execute(&b, c)
	return b.Bytes(), err
}

// indent4 re-indents a YAML block by four spaces.
func indent4(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n")
}
