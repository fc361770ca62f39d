// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package promtext

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseAndSum(t *testing.T) {
	text := `# HELP otelcol_throttle_requests Admission decisions.
# TYPE otelcol_throttle_requests counter
otelcol_throttle_requests{decision="allowed",protocol="http",signal="traces"} 7
otelcol_throttle_requests_total{decision="denied",protocol="grpc",reason="open",signal="traces"} 3
otelcol_throttle_state{extension="throttle",signal="logs"} 2
otelcol_quoted{msg="a \"b\", c\\d"} 1.5
malformed line
otelcol_plain 42 1700000000000
`
	samples := Parse(text)
	require.Len(t, samples, 5)
	assert.Equal(t, Sample{Name: "otelcol_quoted", Labels: map[string]string{"msg": `a "b", c\d`}, Value: 1.5}, samples[3])
	assert.Equal(t, Sample{Name: "otelcol_plain", Labels: map[string]string{}, Value: 42}, samples[4])

	total, found := Sum(samples, "otelcol_throttle_requests", map[string]string{"signal": "traces"})
	assert.True(t, found)
	assert.Equal(t, 10.0, total, "with and without the _total suffix")
	total, found = Sum(samples, "otelcol_throttle_requests", map[string]string{"decision": "denied"})
	assert.True(t, found)
	assert.Equal(t, 3.0, total)
	_, found = Sum(samples, "otelcol_missing", nil)
	assert.False(t, found)
}
