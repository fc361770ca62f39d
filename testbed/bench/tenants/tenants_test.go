// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"compress/gzip"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/otelthrottle/throttle/extension/throttleextension"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
	"github.com/otelthrottle/throttle/testbed/bench/report"
)

func parseYAML(t *testing.T, b []byte) *confmap.Conf {
	t.Helper()
	ret, err := confmap.NewRetrievedFromYAML(b)
	require.NoError(t, err, string(b))
	conf, err := ret.AsConf()
	require.NoError(t, err, string(b))
	return conf
}

// Every throttle gateway's settings are valid for today's extension, and
// the fairness key is the one the gateway is named after.
func TestGatewayConfigs(t *testing.T) {
	want := map[string]struct {
		key     admission.KeySource
		header  string
		trusted []string
	}{
		"throttle-address":   {key: admission.KeyAddress},
		"throttle-tenant":    {key: admission.KeyHeader, header: tenantHeader},
		"throttle-forwarded": {key: admission.KeyAddress, trusted: []string{"127.0.0.20"}},
	}
	for _, g := range gateways {
		b, err := colconfig.Gateway{
			Bench: "bench/tenants", Kind: g.kind, ThrottleYAML: g.throttle, MemoryLimiter: colconfig.MemoryLimiterYAML,
			HTTPPort: 1, GRPCPort: 2, MetricsPort: 3, PprofPort: 4, SinkHTTPPort: 5, Compression: "none",
		}.Render()
		require.NoError(t, err)
		conf := parseYAML(t, b)
		assert.Equal(t, "none", conf.Get("exporters::otlp_http::compression"), g.name)
		w, isThrottle := want[g.name]
		assert.Equal(t, isThrottle, conf.IsSet("extensions::throttle"), g.name)
		if !isThrottle {
			continue
		}
		sub, err := conf.Sub("extensions::throttle")
		require.NoError(t, err)
		cfg := throttleextension.NewFactory().CreateDefaultConfig().(*throttleextension.Config)
		require.NoError(t, sub.Unmarshal(cfg), g.name)
		require.NoError(t, confmap.Validate(cfg), g.name)
		f := cfg.Admission.Fairness
		assert.Equal(t, w.key, f.Key, g.name)
		assert.Equal(t, w.header, f.Header, g.name)
		assert.Equal(t, w.trusted, f.TrustedProxies, g.name)
	}
}

// An agent sends its tenant in the header the throttle-tenant gateway keys
// by, to its tap.
func TestAgentConfig(t *testing.T) {
	b, err := colconfig.Agent{
		Bench: "bench/tenants", HTTPPort: 1, MetricsPort: 2, Exporter: "otlp_http", Endpoint: "http://127.0.0.1:9",
		Compression: "none", Headers: map[string]string{tenantHeader: tenantName(2)},
	}.Render()
	require.NoError(t, err)
	conf := parseYAML(t, b)
	assert.Equal(t, map[string]any{"x-tenant": "tenant-3"}, conf.Get("exporters::otlp_http::headers"))
	assert.Equal(t, "http://127.0.0.1:9", conf.Get("exporters::otlp_http::endpoint"))
}

// The proxy is HAProxy in HTTP mode that adds X-Forwarded-For and reaches
// the gateway from the address the throttle-forwarded gateway trusts.
func TestProxyConfig(t *testing.T) {
	b, err := colconfig.Render(proxyTmpl, proxyConfig{Socket: "/s", Port: 7, GatewayPort: 8, Source: proxyAddr.String(), TimeoutClientServer: proxyTimeout})
	require.NoError(t, err)
	cfg := string(b)
	for _, line := range []string{"mode http", "option forwardfor", "bind 127.0.0.1:7", "source 127.0.0.20", "server gateway 127.0.0.1:8", "stats socket /s "} {
		assert.Contains(t, cfg, line)
	}
	assert.Equal(t, "127.0.0.2", tenantAddr(0).String())
	assert.Equal(t, "127.0.0.19", tenantAddr(maxTenants-1).String(), "the last tenant's address is below the proxy's")
}

// The matrix: every gateway in every topology but throttle-forwarded,
// which differs from throttle-address only behind the proxy.
func TestPairs(t *testing.T) {
	var names []string
	for _, p := range pairs(topologies, gateways) {
		names = append(names, p.name())
	}
	assert.Equal(t, []string{
		"proxy-throttle-address", "proxy-throttle-tenant", "proxy-throttle-forwarded", "proxy-stock", "proxy-mlext",
		"direct-throttle-address", "direct-throttle-tenant", "direct-stock", "direct-mlext",
	}, names)
	g, err := parseGateways("throttle-tenant, stock")
	require.NoError(t, err)
	assert.Len(t, g, 2)
	_, err = parseGateways("throttle-tenant,nginx")
	require.ErrorContains(t, err, `"nginx"`)
	_, err = parseTopologies("proxy,mesh")
	require.ErrorContains(t, err, `"mesh"`)
	o := defaultOptions()
	o.topologies, o.gateways = []string{topoDirect}, []gateway{gateways[2]}
	assert.ErrorContains(t, o.check(), "nothing to run")
}

// A baseline round has the quiet tenants alone at their rate, a noisy
// round the noisy one too at its factor; the noisy tenant is the last.
func TestRoundSpec(t *testing.T) {
	o := defaultOptions()
	o.capacity = 10000
	s := o.setup()
	assert.InDelta(t, 800, s.Rate, 1e-9, "ten tenants at 80 % of 10000 spans/s")
	b := s.spec(pair{topology: topoProxy, gw: gateways[1]}, roundBaseline)
	n := s.spec(pair{topology: topoProxy, gw: gateways[1]}, roundNoisy)
	assert.Equal(t, "proxy-throttle-tenant-noisy", n.name())
	assert.Equal(t, []float64{800, 800, 800, 800, 800, 800, 800, 800, 800, 0}, b.rates)
	assert.Equal(t, []float64{800, 800, 800, 800, 800, 800, 800, 800, 800, 8000}, n.rates)
	assert.Equal(t, 9, n.noisy)
}

// res is one resource of traces: its tenant ("" for none) and its spans
// in each scope.
type res = struct {
	tenant string
	scopes []int
}

// traces builds an ExportTraceServiceRequest of resources.
func traces(t *testing.T, resources ...res) []byte {
	t.Helper()
	td := ptrace.NewTraces()
	for _, r := range resources {
		rs := td.ResourceSpans().AppendEmpty()
		rs.Resource().Attributes().PutStr("service.name", "svc")
		if r.tenant != "" {
			rs.Resource().Attributes().PutStr(tenantAttr, r.tenant)
		}
		rs.Resource().Attributes().PutInt("n", 1)
		for _, n := range r.scopes {
			ss := rs.ScopeSpans().AppendEmpty()
			ss.Scope().SetName("s")
			for range n {
				ss.Spans().AppendEmpty().SetName("x")
			}
		}
	}
	b, err := ptraceotlp.NewExportRequestFromTraces(td).MarshalProto()
	require.NoError(t, err)
	return b
}

// The sink attributes spans to tenants by their resource attribute,
// whatever else the resource and scopes hold, gzip'd or not.
func TestWalkTraces(t *testing.T) {
	b := traces(t, res{"tenant-1", []int{3, 2}}, res{"", []int{4}}, res{"tenant-2", nil}, res{"tenant-1", []int{1}})
	got := map[string]int64{}
	require.NoError(t, walkTraces(b, tenantAttr, func(tenant string, spans int64) { got[tenant] += spans }))
	assert.Equal(t, map[string]int64{"tenant-1": 6, "": 4, "tenant-2": 0}, got)
	n, err := countSpans(b)
	require.NoError(t, err)
	assert.EqualValues(t, 10, n)

	var z bytes.Buffer
	zw := gzip.NewWriter(&z)
	_, _ = zw.Write(b)
	require.NoError(t, zw.Close())
	raw, err := readBody(&z, "gzip")
	require.NoError(t, err)
	assert.Equal(t, b, raw)
	_, err = readBody(strings.NewReader("x"), "zstd")
	require.Error(t, err)

	assert.ErrorIs(t, walkTraces(b[:len(b)-3], tenantAttr, func(string, int64) {}), errProto, "a cut body is malformed")
}

// The sink answers the gateway's exporter with success and counts each
// tenant's spans; spans of no known tenant count as other.
func TestSink(t *testing.T) {
	s, err := startSink([]string{"tenant-1", "tenant-2"})
	require.NoError(t, err)
	defer s.close()
	post := func(body []byte) {
		resp, err := http.Post("http://127.0.0.1:"+itoa(s.port())+"/v1/traces", "application/x-protobuf", bytes.NewReader(body))
		require.NoError(t, err)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode)
	}
	post(traces(t, res{"tenant-2", []int{5}}, res{"tenant-9", []int{2}}))
	post(traces(t, res{"tenant-2", []int{1}}))
	post([]byte{0xff, 0xff})
	assert.Equal(t, map[string]int64{"tenant-1": 0, "tenant-2": 6, otherTenant: 2}, s.snapshot())
	assert.EqualValues(t, 1, s.bad.Load())
}

func itoa(n int) string { return f64(float64(n), 0) }

// The tap forwards an export unchanged from the tenant's address and
// records the answer's class, the spans and the latency.
func TestTap(t *testing.T) {
	var remote, header string
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		remote, header = r.RemoteAddr, r.Header.Get(tenantHeader)
		_, _ = io.Copy(io.Discard, r.Body)
		if status == http.StatusTooManyRequests {
			w.Header().Set("Retry-After", "2")
		}
		w.WriteHeader(status)
	}))
	defer srv.Close()
	tp, err := startTap("tenant-3", tenantAddr(2), srv.URL)
	require.NoError(t, err)
	defer tp.close()
	send := func() *http.Response {
		req, _ := http.NewRequest(http.MethodPost, tp.url()+"/v1/traces", bytes.NewReader(traces(t, res{"tenant-3", []int{7}})))
		req.Header.Set(tenantHeader, "tenant-3")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	assert.Equal(t, http.StatusOK, send().StatusCode)
	host, _, _ := net.SplitHostPort(remote)
	assert.Equal(t, "127.0.0.4", host, "from the tenant's address")
	assert.Equal(t, "tenant-3", header, "headers forwarded")
	status = http.StatusTooManyRequests
	resp := send()
	assert.Equal(t, http.StatusTooManyRequests, resp.StatusCode)
	assert.Equal(t, "2", resp.Header.Get("Retry-After"), "the answer's headers reach the agent")
	ex := tp.snapshot()
	require.Len(t, ex, 2)
	assert.Equal(t, classOK, ex[0].class)
	assert.Equal(t, class429Retry, ex[1].class)
	assert.EqualValues(t, 7, ex[0].spans)
	assert.Positive(t, ex[0].latency)
	ok, refused := tp.counts()
	assert.Equal(t, 1, ok)
	assert.Equal(t, 1, refused)

	srv.Close()
	assert.Equal(t, http.StatusBadGateway, send().StatusCode)
	assert.Equal(t, classError, tp.snapshot()[2].class, "no answer")
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		status int
		ra     bool
		err    error
		want   class
	}{
		{200, false, nil, classOK},
		{204, true, nil, classOK},
		{429, true, nil, class429Retry},
		{429, false, nil, class429},
		{503, true, nil, class503Retry},
		{503, false, nil, class503},
		{502, true, nil, classOtherStatus},
		{400, false, nil, classOtherStatus},
		{0, false, nil, classError},
		{200, false, io.ErrUnexpectedEOF, classError},
	} {
		assert.Equal(t, c.want, classify(c.status, c.ra, c.err), "%d %v %v", c.status, c.ra, c.err)
	}
}

// A tenant's accounting: what it lost is what its agent accepted that is
// neither delivered nor still held; its acceptance is over every attempt.
func TestTenantAccounting(t *testing.T) {
	tr := tenantResult{AgentAccepted: 1000, AgentSent: 900, AgentSendFailed: 20, AgentEnqueueFailed: 30, Delivered: 880}
	assert.InDelta(t, 50, tr.Backlog(), 1e-9)
	assert.InDelta(t, 70, tr.Lost(), 1e-9, "20 acknowledged and not delivered, 50 given up on or dropped")
	tr = tenantResult{AgentAccepted: 1000, AgentSent: 1000, Delivered: 1003}
	assert.InDelta(t, -3, tr.Lost(), 1e-9, "delivered twice (an agent's retry of an answer it timed out on) shows as negative")
	assert.True(t, math.IsNaN(tr.Acceptance()), "nothing sent")

	w := loadWindow{start: time.Unix(100, 0), end: time.Unix(110, 0)}
	exports := []export{
		{at: time.Unix(99, 0), class: classOK, spans: 100, latency: time.Second},
		{at: time.Unix(101, 0), class: classOK, spans: 100, latency: 10 * time.Millisecond},
		{at: time.Unix(102, 0), class: class429Retry, spans: 300},
		{at: time.Unix(103, 0), class: classOK, spans: 300, latency: 30 * time.Millisecond},
		{at: time.Unix(104, 0), class: class503, spans: 200},
		{at: time.Unix(111, 0), class: classOK, spans: 100, latency: 2 * time.Second},
	}
	lat := tapFigures(&tr, exports, w)
	assert.Equal(t, []float64{10, 30}, lat, "accepted exports in the window only")
	assert.InDelta(t, 30, float64(tr.P99Ms), 1e-9)
	assert.Equal(t, [numClasses]int64{4, 1, 0, 0, 1, 0, 0}, tr.Exports)
	assert.InDelta(t, 600.0/1100, tr.Acceptance(), 1e-9, "spans accepted over every attempt")
	assert.Equal(t, [numClasses]int64{100, 0, 0, 0, 0, 0, 0}, tr.SettledSpans, "from settleAfter into the window on")
	assert.InDelta(t, 1, tr.SettledAcceptance(), 1e-9)
	refused, hinted := tr.Refused()
	assert.EqualValues(t, 2, refused)
	assert.EqualValues(t, 1, hinted)

	at := []time.Time{time.Unix(99, 0), time.Unix(100, 500e6), time.Unix(105, 500e6), time.Unix(109, 500e6), time.Unix(111, 0)}
	assert.InDelta(t, 200, windowRate(at, []int64{0, 100, 1100, 1900, 5000}, w), 1e-9, "from the samples within the window")
	assert.True(t, math.IsNaN(windowRate(at[:2], []int64{0, 100}, w)))
	assert.InDelta(t, 20, percentile([]float64{40, 10, 30, 20}, 50), 1e-9)
	assert.InDelta(t, 40, percentile([]float64{40, 10, 30, 20}, 99), 1e-9)
}

// The round's gateway figures: the largest OOM count and working set, the
// means of the load window alone, the seconds in each state.
func TestGatewayFigures(t *testing.T) {
	w := loadWindow{start: time.Unix(10, 0), end: time.Unix(13, 0)}
	pt := func(sec int64, ws, oom uint64, cpu, host, state float64) point {
		return point{
			at: time.Unix(sec, 0), cgOK: true, cg: harness.CgStats{WorkingSet: ws, Limit: 100, OOMKills: oom},
			cpuPct: cpu, hostPct: host, state: state, reserved: float64(ws), budget: 50,
		}
	}
	var r roundResult
	gatewayFigures(&r, []point{
		pt(9, 10, 0, 100, 100, 0), pt(10, 40, 0, 50, 60, 1), pt(11, 30, 1, 70, 80, 2), pt(12, 20, 1, -1, 70, 0), pt(14, 90, 1, 100, 100, 0),
	}, w, time.Second)
	assert.EqualValues(t, 1, r.OOMKills)
	assert.InDelta(t, 90, float64(r.PeakWSBytes), 1e-9)
	assert.InDelta(t, 60, float64(r.CPUMeanPct), 1e-9, "an unknown CPU sample is left out")
	assert.InDelta(t, 70, float64(r.HostMeanPct), 1e-9)
	assert.InDelta(t, 80, float64(r.HostMaxPct), 1e-9)
	assert.InDelta(t, 1, float64(r.ShedSeconds), 1e-9)
	assert.InDelta(t, 1, float64(r.OpenSeconds), 1e-9)
	assert.InDelta(t, 50, float64(r.Budget), 1e-9)
}

// quietTenants makes nine quiet tenants alike: okSpans of the 1000 spans
// they sent accepted, rate delivered.
func quietTenants(okSpans int64, rate float64) []tenantResult {
	const allSpans = 1000
	var out []tenantResult
	for i := range 9 {
		t := tenantResult{Tenant: tenantName(i), AgentAccepted: num(allSpans), AgentSent: num(allSpans), Delivered: allSpans, WindowRate: num(rate)}
		t.Spans[classOK], t.Spans[class429Retry] = okSpans, allSpans-okSpans
		out = append(out, t)
	}
	return out
}

// The benchmark's targets, computed from a baseline and a noisy round: each
// passes at its bound and fails past it.
func TestTargets(t *testing.T) {
	mk := func(okPerMille int64, p99Base, p99Noisy float64, hinted, refused int64, lost float64, oom uint64) comparison {
		base := &roundResult{Round: roundBaseline, Tenants: quietTenants(1000, 700), QuietP99Ms: num(p99Base), Drained: true}
		noisy := &roundResult{Round: roundNoisy, Tenants: quietTenants(okPerMille, 690), QuietP99Ms: num(p99Noisy), Drained: true, OOMKills: oom}
		noisy.Tenants[0].Delivered -= int64(lost)
		nt := tenantResult{Tenant: tenantName(9), Noisy: true}
		nt.Exports[class429Retry], nt.Exports[class429] = hinted, refused-hinted
		noisy.Tenants = append(noisy.Tenants, nt)
		return comparison{base: base, noisy: noisy}
	}
	pass := func(c comparison) []bool {
		var out []bool
		for _, tg := range c.targets() {
			out = append(out, tg.Pass)
		}
		return out
	}
	assert.Equal(t, []bool{true, true, true, true, true}, pass(mk(990, 100, 110, 50, 50, 0, 0)), "every target at its bound")
	assert.Equal(t, []bool{false, true, false, false, false}, pass(mk(989, 100, 110.5, 49, 50, 0, 1)))
	assert.Equal(t, []bool{true, false, true, false, true}, pass(mk(1000, 100, 90, 0, 0, 5, 0)), "a loss; nothing refused")
	c := mk(990, 100, 110, 50, 50, 0, 0)
	lowest, pooled := c.quietAcceptance()
	assert.InDelta(t, 0.99, lowest, 1e-9)
	assert.InDelta(t, 0.99, pooled, 1e-9)
	for i := range c.base.Tenants {
		c.base.Tenants[i].SettledSpans[classOK] = 500
		c.noisy.Tenants[i].SettledSpans[classOK], c.noisy.Tenants[i].SettledSpans[class429Retry] = 495, 5
	}
	c.noisy.Tenants[0].SettledSpans[classOK], c.noisy.Tenants[0].SettledSpans[class429Retry] = 450, 50
	lowest, pooled = c.quietSettledAcceptance()
	assert.InDelta(t, 0.90, lowest, 1e-9, "from settleAfter on: the tenant refused most")
	assert.InDelta(t, (8*495+450)/4500.0, pooled, 1e-9)
	assert.InDelta(t, 690.0/700, c.quietThroughput(), 1e-9)
	assert.InDelta(t, 0.10, c.p99Rise(), 1e-9)
	c.noisy.Drained = false
	assert.False(t, c.targets()[1].Pass, "undrained quiet agents have not shown they lose nothing")
}

// The report is written from the run's files alone, carries the machine,
// commit and command make promote reads, and make promote takes the run.
func TestReport(t *testing.T) {
	dir := t.TempDir()
	o := defaultOptions()
	o.capacity = 10000
	s := o.setup()
	s.Measured = true
	require.NoError(t, writeJSON(filepath.Join(dir, setupFile), s))
	c := func(topo, gw string) []*roundResult {
		b := &roundResult{
			Name: topo + "-" + gw + "-baseline", Topology: topo, Gateway: gw, Round: roundBaseline,
			Tenants: quietTenants(1000, 700), QuietP99Ms: 100, Drained: true, HostMeanPct: 60, PeakWSBytes: 50 << 20,
			Allowed: num(math.NaN()), DeniedShed: num(math.NaN()),
		}
		n := &roundResult{
			Name: topo + "-" + gw + "-noisy", Topology: topo, Gateway: gw, Round: roundNoisy,
			Tenants: quietTenants(900, 650), QuietP99Ms: 130, Drained: true, HostMeanPct: 75, PeakWSBytes: 80 << 20,
			Allowed: 2000, DeniedBudget: 40, CutOff: map[string]num{"budget": 7, "open": 0, "slow": 1, "stopping": 2},
		}
		n.Tenants = append(n.Tenants, tenantResult{Tenant: tenantName(9), Noisy: true, Rate: 7000})
		return []*roundResult{b, n}
	}
	results := append(c(topoProxy, "throttle-tenant"), c(topoProxy, "throttle-address")...)
	results = append(results, c(topoDirect, "throttle-tenant")...)
	require.NoError(t, writeJSON(filepath.Join(dir, resultsFile), results))
	machine := "date (UTC)  2026-12-05T10:00:00Z\ncommit      abc1234\ncommand     bin/tenants -round 40s\n"
	require.NoError(t, os.WriteFile(filepath.Join(dir, machineFile), []byte(machine), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, capacityFile), []byte("\nCapacity: 10000 spans/s.\n"), 0o644))
	tl, err := harness.CreateCSV(filepath.Join(dir, timelineFile), timelineHeader(10))
	require.NoError(t, err)
	for _, r := range results[:4] {
		for sec := range 5 {
			row := make([]string, len(timelineHeader(10)))
			row[0], row[4], row[6] = r.Name, itoa(sec), "load"
			for i := range 10 {
				row[len(row)-3*(10-i)] = itoa(700 * sec)
			}
			tl.Write(row)
		}
	}
	require.NoError(t, tl.Close())

	require.ErrorContains(t, writeReport(dir), "chart", "the direct topology's noisy round is not in the timeline")
	results = results[:4]
	require.NoError(t, writeJSON(filepath.Join(dir, resultsFile), results))
	require.NoError(t, writeReport(dir))
	md, err := os.ReadFile(filepath.Join(dir, reportFile))
	require.NoError(t, err)
	text := string(md)
	info := harness.ParseRunInfo(text)
	assert.Equal(t, "abc1234", info.Commit)
	assert.Equal(t, "bin/tenants -round 40s", info.Command)
	assert.Contains(t, text, "| the nine quiet tenants keep >= 99 % of the acceptance they have without the noisy tenant | **fail**: lowest tenant 90.0 %, pooled 90.0 % | **fail**: lowest tenant 90.0 %, pooled 90.0 % |")
	assert.Contains(t, text, "| the same, settled (from 10s into the load) |")
	assert.Contains(t, text, "![tenants-proxy](tenants-proxy.png)")
	assert.FileExists(t, filepath.Join(dir, "tenants-proxy.png"))
	assert.Contains(t, text, "| their p99 latency rises <= 10 % | **fail**: 100.0 -> 130.0 ms (+30.0 %) |")
	assert.Contains(t, text, "ranges from 100 to 100 ms")
	assert.Contains(t, text, "Capacity: 10000 spans/s.")
	assert.Contains(t, text, "| proxy-throttle-tenant-noisy | 2000 | 0 / 0 / 40 | 7 / 0 / 1 / 2 |", "the cut-offs by reason beside the decisions")
	assert.Contains(t, text, "| proxy-throttle-tenant-baseline |  |  / 0 / 0 |  /  /  /  |", "a round without the counter shows no figure")
	assert.Contains(t, text, "within a pair the rounds differ by up to 15 points")
	sum, err := report.ReadCSV(filepath.Join(dir, summaryFile))
	require.NoError(t, err)
	assert.Len(t, sum.Rows, 38, "a row per round and tenant")
	assert.Equal(t, "0.90000", sum.Rows[9]["acceptance"])

	results = nil
	require.NoError(t, readJSON(filepath.Join(dir, resultsFile), &results))
	assert.True(t, math.IsNaN(float64(results[0].Allowed)), "a missing figure stays missing")

	res := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(res, report.IndexFile),
		[]byte("| baseline | benchmark | date | commit | command |\n| --- | --- | --- | --- | --- |\n"), 0o644))
	_, err = report.Promote(report.Promotion{Run: dir, Results: res, Baseline: "tenants"})
	require.NoError(t, err, "make promote takes the run")
	idx, err := os.ReadFile(filepath.Join(res, report.IndexFile))
	require.NoError(t, err)
	assert.Contains(t, string(idx), "| [tenants](tenants/report.md) | tenants | 2026-12-05 | abc1234 | `bin/tenants -round 40s` |")
}
