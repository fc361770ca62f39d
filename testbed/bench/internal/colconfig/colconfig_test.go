// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package colconfig

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
)

func TestIndent(t *testing.T) {
	assert.Equal(t, "    a: 1\n    b:\n      c: 2", Indent(4, "a: 1\nb:\n  c: 2\n"))
}

// Every collector a benchmark starts serves its own metrics where the
// harness scrapes them: on 127.0.0.1 at its MetricsPort, without the
// suffixes the harness's names leave out.
func TestTelemetry(t *testing.T) {
	tmpl := New("t", "service:\n"+Telemetry("normal"))
	b, err := Render(tmpl, struct{ MetricsPort int }{8888})
	require.NoError(t, err)
	ret, err := confmap.NewRetrievedFromYAML(b)
	require.NoError(t, err)
	conf, err := ret.AsConf()
	require.NoError(t, err)
	assert.Equal(t, "normal", conf.Get("service::telemetry::metrics::level"))
	readers, ok := conf.Get("service::telemetry::metrics::readers").([]any)
	require.True(t, ok)
	require.Len(t, readers, 1)
	prom := confmap.NewFromStringMap(readers[0].(map[string]any)).Sub
	p, err := prom("pull::exporter::prometheus")
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", p.Get("host"))
	assert.Equal(t, 8888, p.Get("port"))
	assert.Equal(t, true, p.Get("without_type_suffix"))
}
