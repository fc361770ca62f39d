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

// An agent sends the headers it is given with every export; without them
// it sends none, as users run it.
func TestAgentHeaders(t *testing.T) {
	conf := func(a Agent) *confmap.Conf { return rendered(t, a) }
	a := Agent{Bench: "t", HTTPPort: 1, MetricsPort: 2, Exporter: "otlp_http", Endpoint: "http://127.0.0.1:3"}
	assert.False(t, conf(a).IsSet("exporters::otlp_http::headers"))
	a.Headers = map[string]string{"x-tenant": "tenant: 1", "X-Scope-OrgID": `a"b`}
	assert.Equal(t, map[string]any{"x-tenant": "tenant: 1", "X-Scope-OrgID": `a"b`}, conf(a).Get("exporters::otlp_http::headers"), "quoted as YAML strings")
}

// A gateway's exporter to the sink compresses as its default (gzip)
// unless told otherwise.
func TestGatewayCompression(t *testing.T) {
	g := Gateway{Bench: "t", Kind: KindThrottle, HTTPPort: 1, GRPCPort: 2, MetricsPort: 3, PprofPort: 4, SinkHTTPPort: 5}
	b, err := g.Render()
	require.NoError(t, err)
	assert.NotContains(t, string(b), "compression")
	g.Compression = "none"
	b, err = g.Render()
	require.NoError(t, err)
	assert.Contains(t, string(b), "    endpoint: \"http://127.0.0.1:5\"\n    compression: none\n")
}

// The downstream level reads the gateway's own metrics endpoint, beside
// any other throttle settings; the queue is the exporter's default unless
// sized.
func TestGatewayDownstreamAndQueue(t *testing.T) {
	conf := func(g Gateway) *confmap.Conf { return rendered(t, g) }
	g := Gateway{Bench: "t", Kind: KindThrottle, HTTPPort: 1, GRPCPort: 2, MetricsPort: 3, PprofPort: 4, SinkHTTPPort: 5}
	c := conf(g)
	assert.False(t, c.IsSet("extensions::throttle::downstream"))
	assert.False(t, c.IsSet("exporters::otlp_http::sending_queue"))
	g.Downstream, g.QueueSize, g.ThrottleYAML = true, 100, "cpu:\n  enabled: false"
	c = conf(g)
	assert.Equal(t, true, c.Get("extensions::throttle::downstream::enabled"))
	assert.Equal(t, "http://127.0.0.1:3/metrics", c.Get("extensions::throttle::downstream::endpoint"))
	assert.Equal(t, false, c.Get("extensions::throttle::cpu::enabled"), "the other settings kept")
	assert.Equal(t, 100, c.Get("exporters::otlp_http::sending_queue::queue_size"))
}

// rendered is the configuration r renders, parsed as the collector does.
func rendered(t *testing.T, r interface{ Render() ([]byte, error) }) *confmap.Conf {
	t.Helper()
	b, err := r.Render()
	require.NoError(t, err)
	ret, err := confmap.NewRetrievedFromYAML(b)
	require.NoError(t, err, string(b))
	c, err := ret.AsConf()
	require.NoError(t, err, string(b))
	return c
}
