// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package series

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// exposition is the shape of the collector's /metrics: counters with and
// without the _total suffix, a gauge, a histogram, escapes in a label value
// and a timestamp.
const exposition = `# HELP otelcol_throttle_requests Admission decisions.
# TYPE otelcol_throttle_requests counter
otelcol_throttle_requests{decision="allowed",protocol="http",signal="traces"} 7
# TYPE otelcol_throttle_requests_total counter
otelcol_throttle_requests_total{decision="denied",protocol="grpc",reason="open",signal="traces"} 3
# TYPE otelcol_throttle_state gauge
otelcol_throttle_state{extension="throttle",signal="logs"} 2
otelcol_quoted{msg="a \"b\", c\\d"} 1.5
otelcol_plain 42 1700000000000
# TYPE otelcol_throttle_sample_duration_seconds histogram
otelcol_throttle_sample_duration_seconds_bucket{le="0.001"} 4
otelcol_throttle_sample_duration_seconds_bucket{le="+Inf"} 5
otelcol_throttle_sample_duration_seconds_sum 0.0042
otelcol_throttle_sample_duration_seconds_count 5
`

func TestParseAndSum(t *testing.T) {
	samples, err := Parse(exposition)
	require.NoError(t, err)
	assert.Len(t, samples, 9)
	assert.Contains(t, samples, Sample{Name: "otelcol_quoted", Labels: map[string]string{"msg": `a "b", c\d`}, Value: 1.5})
	assert.Contains(t, samples, Sample{Name: "otelcol_plain", Labels: map[string]string{}, Value: 42})
	assert.Contains(t, samples, Sample{Name: "otelcol_throttle_sample_duration_seconds_bucket", Labels: map[string]string{"le": "0.001"}, Value: 4})

	f := func(name string, want map[string]string, total float64, found bool) {
		t.Helper()
		gotTotal, gotFound := Sum(samples, name, want)
		assert.Equal(t, found, gotFound, "%s %v", name, want)
		assert.InDelta(t, total, gotTotal, 1e-12, "%s %v", name, want)
	}
	f("otelcol_throttle_requests", map[string]string{"signal": "traces"}, 10, true) // with and without the _total suffix
	f("otelcol_throttle_requests", map[string]string{"decision": "denied"}, 3, true)
	f("otelcol_throttle_requests", map[string]string{"decision": "queued"}, 0, false)
	f("otelcol_throttle_sample_duration_seconds_count", nil, 5, true)
	f("otelcol_throttle_sample_duration_seconds_sum", nil, 0.0042, true)
	f("otelcol_missing", nil, 0, false)
}

func TestParseMalformed(t *testing.T) {
	for _, in := range []string{
		"otelcol_x{a=\"b\" 1\n",
		"otelcol_x one\n",
		"# TYPE otelcol_x counter\n# TYPE otelcol_x gauge\notelcol_x 1\n",
	} {
		_, err := Parse(in)
		require.ErrorContains(t, err, "prometheus exposition", in)
	}
	samples, err := Parse("")
	require.NoError(t, err)
	assert.Empty(t, samples)
}

func TestQuantile(t *testing.T) {
	f := func(text string, want map[string]string, q, expected float64) {
		t.Helper()
		samples, err := Parse(text)
		require.NoError(t, err)
		got := Quantile(samples, "d", want, q)
		if math.IsNaN(expected) {
			assert.True(t, math.IsNaN(got), "got %v", got)
			return
		}
		assert.Equal(t, expected, got)
	}
	const two = `d_bucket{code="OK",le="0.1"} 90
d_bucket{code="OK",le="1"} 99
d_bucket{code="OK",le="+Inf"} 100
d_bucket{code="ERR",le="0.1"} 0
d_bucket{code="ERR",le="1"} 0
d_bucket{code="ERR",le="+Inf"} 100
d_count{code="OK"} 100
`
	f(two, map[string]string{"code": "OK"}, 0.5, 0.1)
	f(two, map[string]string{"code": "OK"}, 0.99, 1)
	f(two, map[string]string{"code": "OK"}, 0.999, math.Inf(1))
	f(two, nil, 0.5, math.Inf(1))                              // the errors are all slow
	f(two, map[string]string{"code": "NONE"}, 0.5, math.NaN()) // no such series
	f("d_bucket{le=\"1\"} 0\nd_bucket{le=\"+Inf\"} 0\n", nil, 0.5, math.NaN())
}
