// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package downstream

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseQueues(t *testing.T) {
	f := func(in string, want []Queue) {
		t.Helper()
		got, err := parseQueues(strings.NewReader(in))
		require.NoError(t, err)
		assert.Equal(t, want, got)
	}
	// What a v0.165 collector serves (its telemetry's Prometheus reader).
	f(`# HELP otelcol_exporter_queue_capacity Fixed capacity of the retry queue (in batches). [Alpha]
# TYPE otelcol_exporter_queue_capacity gauge
otelcol_exporter_queue_capacity{data_type="traces",exporter="otlp_grpc/backend"} 100
# HELP otelcol_exporter_queue_size Current size of the retry queue (in batches). [Alpha]
# TYPE otelcol_exporter_queue_size gauge
otelcol_exporter_queue_size{data_type="traces",exporter="otlp_grpc/backend"} 37
`, []Queue{{Exporter: "otlp_grpc/backend", Signal: "traces", Size: 37, Capacity: 100}})
	// Two exporters and signals, labels in any order, scope labels, a
	// timestamp, sizes before capacities.
	f(`otelcol_exporter_queue_size{exporter="a",data_type="logs",otel_scope_name="x"} 5 1700000000000
otelcol_exporter_queue_size{data_type="traces",exporter="b"} 0
otelcol_exporter_queue_capacity{otel_scope_name="x",exporter="a",data_type="logs"} 1000 1700000000000
otelcol_exporter_queue_capacity{data_type="traces",exporter="b"} 10
`, []Queue{{Exporter: "a", Signal: "logs", Size: 5, Capacity: 1000}, {Exporter: "b", Signal: "traces", Size: 0, Capacity: 10}})
	// A size without its capacity is no queue; neighbours with the same
	// prefix and other metrics are skipped.
	f(`otelcol_exporter_queue_size{data_type="traces",exporter="a"} 5
otelcol_exporter_queue_size_bytes{data_type="traces",exporter="b"} 5
otelcol_exporter_queue_capacity_total{data_type="traces",exporter="b"} 5
otelcol_exporter_sent_spans_total{exporter="a"} 9
`, nil)
	// Escaped label values; values that are no count; no exporter label.
	f(`otelcol_exporter_queue_size{exporter="we\"ird\\name",data_type="traces"} 1
otelcol_exporter_queue_capacity{exporter="we\"ird\\name",data_type="traces"} 4
otelcol_exporter_queue_size{exporter="c",data_type="traces"} NaNx
otelcol_exporter_queue_capacity{exporter="c",data_type="traces"} 4
otelcol_exporter_queue_size{exporter="d",data_type="traces"} NaN
otelcol_exporter_queue_capacity{exporter="d",data_type="traces"} 4
otelcol_exporter_queue_size{exporter="e",data_type="traces"} -1
otelcol_exporter_queue_capacity{exporter="e",data_type="traces"} 4
otelcol_exporter_queue_size{exporter="f",data_type="traces"} 1
otelcol_exporter_queue_capacity{exporter="f",data_type="traces"} +Inf
otelcol_exporter_queue_size{data_type="traces"} 1
otelcol_exporter_queue_capacity{data_type="traces"} 4
otelcol_exporter_queue_size{exporter="unterminated} 1
`, []Queue{{Exporter: `we"ird\name`, Signal: "traces", Size: 1, Capacity: 4}})
	f("", nil)
}

func TestQueueFill(t *testing.T) {
	f := func(q Queue, want float64) {
		t.Helper()
		assert.InDelta(t, want, q.Fill(), 1e-9)
	}
	f(Queue{Size: 25, Capacity: 100}, 0.25)
	f(Queue{Size: 100, Capacity: 100}, 1)
	f(Queue{Size: 5, Capacity: 0}, 0)
}

// TestParseQueuesLongLine: a line past the buffer is skipped, whichever
// metric it is, and the buffer does not grow for it.
func TestParseQueuesLongLine(t *testing.T) {
	long := `otelcol_exporter_queue_size{data_type="traces",exporter="` + strings.Repeat("a", maxLine) + `"} 5` + "\n"
	queues, err := parseQueues(strings.NewReader(long + `otelcol_exporter_queue_size{data_type="traces",exporter="b"} 5
otelcol_exporter_queue_capacity{data_type="traces",exporter="b"} 10`)) // no newline at the end
	require.NoError(t, err)
	assert.Equal(t, []Queue{{Exporter: "b", Signal: "traces", Size: 5, Capacity: 10}}, queues)
}
