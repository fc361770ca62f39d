// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage

import (
	"encoding/json"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

var serverNow = time.Date(2025, 6, 1, 12, 10, 0, 0, time.UTC)

func sampleLevelsOf(l [sampler.MaxResources]sampler.Level) [sampler.MaxResources]SampleLevel {
	return SampleLevels(&l)
}

// cpuAndMemory are the levels of testInfo's resources: CPU (the level and
// its slow and fast averages) and memory.
func cpuAndMemory(cpu, slow, fast float64, cpuValid bool, mem float64, memValid bool) [sampler.MaxResources]sampler.Level {
	return [sampler.MaxResources]sampler.Level{
		{Valid: cpuValid, Value: cpu, Slow: slow, Fast: fast},
		{Valid: memValid, Value: mem, Slow: mem, Fast: mem},
	}
}

func testLive() LiveStatus {
	return LiveStatus{
		At:         time.Date(2025, 6, 1, 12, 9, 59, 750_000_000, time.UTC),
		Levels:     cpuAndMemory(0.93, 0.84, 0.88, true, 0.5, true),
		WorkingSet: 256 << 20, MemLimit: 512 << 20, Cores: 1.5,
		Stale: true,
		Signals: [decision.NumSignals]SignalStatus{
			{State: decision.StateShedding, DropProbability: 0.4, Allowed: 100, DeniedShed: 7, DeniedOpen: 2, DeniedBudget: 1, CutOff: 3},
			{State: decision.StateNormal, Allowed: 50},
			{State: decision.StateOpen, DropProbability: 1, Allowed: 3, DeniedOpen: 9},
			{State: decision.StateShedding, DropProbability: 0.2, DeniedBudget: 4},
		},
		BudgetReserved: 3 << 20,
		BudgetPeak:     5 << 20,
		HeldRequests:   2,
		Keys: []KeyStatus{
			{Name: "tenant-a", Reserved: 2 << 20, Held: 1, Admitted: 40, Refused: 3},
			{Name: "other", Reserved: 1 << 20, Admitted: 9},
		},
		BudgetLimit: 24 << 20,
		Go:          GoRuntime{MemoryLimit: 400 << 20, MemoryLimitSetBy: "owned by throttle", GCPercent: 150, GCPercentSetBy: "owned by throttle"},
		Transitions: []Transition{
			{
				At: time.Date(2025, 6, 1, 12, 9, 58, 0, time.UTC), Signals: [decision.NumSignals]bool{true, false, true, false},
				From: decision.StateShedding, To: decision.StateOpen, Why: "memory 93% ≥ hard 92%",
			},
			{
				At: time.Date(2025, 6, 1, 12, 9, 50, 0, time.UTC), Signals: [decision.NumSignals]bool{true, true, true, true},
				From: decision.StateNormal, To: decision.StateShedding, Why: "cpu slow 91% > enter 90%",
			},
		},
	}
}

// testEndpoint is the extension's default status endpoint.
const testEndpoint = "localhost:55680"

func newTestHandler(ring *Ring, info func() Info, live func() LiveStatus) http.Handler {
	h := Handler(ring, info, live, testEndpoint).(*handler)
	h.now = func() time.Time { return serverNow }
	return h
}

// get sends a request as a browser that opened http://localhost:55680/ would.
func get(t *testing.T, h http.Handler, method, target string) *http.Response {
	t.Helper()
	return getHost(t, h, method, target, testEndpoint)
}

func getHost(t *testing.T, h http.Handler, method, target, host string) *http.Response {
	t.Helper()
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(method, target, http.NoBody)
	req.Host = host
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func body(t *testing.T, r *http.Response) string {
	t.Helper()
	b, err := io.ReadAll(r.Body)
	require.NoError(t, err)
	return string(b)
}

func TestStatusJSON(t *testing.T) {
	ring := NewRingFor(250 * time.Millisecond)
	ring.Record(sampleAt(0))
	h := newTestHandler(ring, testInfo, testLive)
	r := get(t, h, http.MethodGet, "/status")
	require.Equal(t, http.StatusOK, r.StatusCode)
	assert.Equal(t, "application/json; charset=utf-8", r.Header.Get("Content-Type"))
	assert.Equal(t, "no-store", r.Header.Get("Cache-Control"))
	assert.JSONEq(t, `{
		"now": 1748779800000,
		"time": 1748779799750,
		"stale": true,
		"observe_only": false,
		"source": "cgroup v2 /sys/fs/cgroup/kubepods/pod-1234/otelcol",
		"level": {"cpu": 0.93, "cpu_fast": 0.88, "cpu_slow": 0.84, "cpu_valid": true,
		          "memory": 0.5, "memory_valid": true, "working_set": 268435456, "memory_limit": 536870912, "cores": 1.5},
		"thresholds": {
			"cpu": {"enabled": true, "enter": 0.9, "exit": 0.8, "hard": 1.1, "breach_n": 3},
			"memory": {"enabled": true, "enter": 0.85, "exit": 0.78, "hard": 0.92, "breach_n": 1}
		},
		"signals": [
			{"name": "traces", "enabled": true, "drop_min": 0, "drop_max": 1, "state": "shedding", "state_code": 1,
			 "drop_probability": 0.4, "allowed": 100, "denied": {"shed": 7, "open": 2, "budget": 1}, "cut_off": 3},
			{"name": "metrics", "enabled": false, "drop_min": 0, "drop_max": 1, "state": "normal", "state_code": 0,
			 "drop_probability": 0, "allowed": 50, "denied": {"shed": 0, "open": 0, "budget": 0}, "cut_off": 0},
			{"name": "logs", "enabled": true, "drop_min": 0, "drop_max": 1, "state": "open", "state_code": 2,
			 "drop_probability": 1, "allowed": 3, "denied": {"shed": 0, "open": 9, "budget": 0}, "cut_off": 0},
			{"name": "profiles", "enabled": true, "drop_min": 0, "drop_max": 0.5, "state": "shedding", "state_code": 1,
			 "drop_probability": 0.2, "allowed": 0, "denied": {"shed": 0, "open": 0, "budget": 4}, "cut_off": 0}
		],
		"budget": {"reserved": 3145728, "limit": 25165824, "peak": 5242880, "held_requests": 2},
		"keys": [{"key": "tenant-a", "reserved": 2097152, "held": 1, "admitted": 40, "refused": 3},
			 {"key": "other", "reserved": 1048576, "held": 0, "admitted": 9, "refused": 0}],
		"go": {"memory_limit": 419430400, "memory_limit_set_by": "owned by throttle",
		       "gc_percent": 150, "gc_percent_set_by": "owned by throttle"},
		"transitions": [
			{"t": 1748779798000, "signals": ["traces", "logs"], "from": "shedding", "to": "open", "why": "memory 93% ≥ hard 92%"},
			{"t": 1748779790000, "signals": ["traces", "metrics", "logs", "profiles"], "from": "normal", "to": "shedding",
			 "why": "cpu slow 91% > enter 90%"}
		],
		"history": {"window_ms": 600000, "capacity": 2400, "length": 1, "min_gap_ms": 0, "interval_ms": 250},
		"config": {
			"enabled": true, "observe_only": false, "check_interval": "250ms",
			"cpu": {"enabled": true, "enter": 0.9, "exit": 0.8, "hard": 1.1, "max_shed": 0.2},
			"memory": {"enabled": true, "enter": 0.85, "exit": 0.78, "hard": 0.92,
			           "soft_limit": {"enabled": true, "share": 0.8, "heap_target": 0.5}},
			"routes": {"http": {}, "grpc": null},
			"status": {"endpoint": "localhost:55680", "include_metadata": false,
			           "cors": {"allowed_origins": ["https://a.example", "https://b.example"]}},
			"note": "a: b"
		}
	}`, body(t, r))

	// With observe_only the document says so (the page shows its banner).
	observe := func() Info { in := testInfo(); in.ObserveOnly = true; return in }
	var doc struct {
		ObserveOnly bool `json:"observe_only"`
	}
	require.NoError(t, json.Unmarshal([]byte(body(t, get(t, newTestHandler(ring, observe, testLive), http.MethodGet, "/status"))), &doc))
	assert.True(t, doc.ObserveOnly)
}

func TestStatusBeforeFirstSample(t *testing.T) {
	// Nil ring and funcs (and NaN levels) still give a well-formed document.
	h := newTestHandler(nil, func() Info { return Info{Resources: testInfo().Resources} }, func() LiveStatus {
		return LiveStatus{Levels: cpuAndMemory(math.NaN(), 0, 0, false, math.Inf(1), false)}
	})
	r := get(t, h, http.MethodGet, "/status")
	require.Equal(t, http.StatusOK, r.StatusCode)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(body(t, r)), &doc))
	assert.InDelta(t, 0, doc["time"], 0)
	level := doc["level"].(map[string]any)
	assert.InDelta(t, 0, level["cpu"], 0)
	assert.InDelta(t, 0, level["memory"], 0)
	assert.Equal(t, false, level["cpu_valid"])
	assert.Len(t, doc["signals"], 4)
	assert.Equal(t, []any{}, doc["transitions"])
	assert.Equal(t, map[string]any{}, doc["config"])

	r = get(t, newTestHandler(nil, nil, nil), http.MethodGet, "/status/history")
	require.Equal(t, http.StatusOK, r.StatusCode)
	assert.JSONEq(t, `{"now": 1748779800000, "window_ms": 600000, "samples": [], "more": false}`, body(t, r))
}

func TestHistoryJSON(t *testing.T) {
	ring := NewRing(10)
	base := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	ring.Record(Sample{
		At:         base.Add(100*time.Millisecond + 400*time.Microsecond),
		Levels:     sampleLevelsOf(cpuAndMemory(0.123456789, 0.3, 0.2, true, math.NaN(), false)),
		WorkingSet: math.NaN(),
		States:     [decision.NumSignals]decision.State{decision.StateNormal, decision.StateShedding, decision.StateOpen, decision.StateNormal},
		Allowed:    10, Denied: 1,
	})
	ring.Record(Sample{
		At:         base.Add(350 * time.Millisecond),
		Levels:     sampleLevelsOf(cpuAndMemory(1.5, 0.9, 1.2, true, 0.92, true)),
		WorkingSet: 0.950049,
		States:     [decision.NumSignals]decision.State{decision.StateOpen, decision.StateOpen, decision.StateOpen, decision.StateOpen},
		Allowed:    12, Denied: 40,
	})
	h := newTestHandler(ring, testInfo, testLive)
	first := `{"t": 1748779200100, "cpu": 0.1235, "cpu_fast": 0.2, "cpu_slow": 0.3, "cpu_valid": true,
		"memory": 0, "memory_valid": false, "memory_working_set": 0, "states": [0, 1, 2, 0], "allowed": 10, "denied": 1}`
	second := `{"t": 1748779200350, "cpu": 1.5, "cpu_fast": 1.2, "cpu_slow": 0.9, "cpu_valid": true,
		"memory": 0.92, "memory_valid": true, "memory_working_set": 0.95, "states": [2, 2, 2, 2], "allowed": 12, "denied": 40}`
	doc := func(samples ...string) string {
		return `{"now": 1748779800000, "window_ms": 600000, "samples": [` + strings.Join(samples, ",") + `], "more": false}`
	}
	for _, tc := range []struct {
		target string
		want   string
	}{
		{"/status/history", doc(first, second)},
		{"/status/history?since=", doc(first, second)},
		{"/status/history?since=1748779200099", doc(first, second)},
		// The page passes back the truncated t of its last sample: the
		// sample at .100400 must not come back.
		{"/status/history?since=1748779200100", doc(second)},
		{"/status/history?since=1748779200350", doc()},
		{"/status/history?since=2025-06-01T12:00:00.2Z", doc(second)},
		{"/status/history?since=2025-06-01T12:00:00.1004Z", doc(second)},
		{"/status/history?since=2025-06-01T12:00:00.1003Z", doc(first, second)},
	} {
		t.Run(tc.target, func(t *testing.T) {
			r := get(t, h, http.MethodGet, tc.target)
			require.Equal(t, http.StatusOK, r.StatusCode)
			assert.Equal(t, "application/json; charset=utf-8", r.Header.Get("Content-Type"))
			assert.JSONEq(t, tc.want, body(t, r))
		})
	}

	r := get(t, h, http.MethodGet, "/status/history?since=yesterday")
	assert.Equal(t, http.StatusBadRequest, r.StatusCode)
}

// TestHistoryBounded: one response holds at most MaxHistorySamples samples
// (or ?limit=N); a reader that passes back the t of the last sample as since
// gets the whole ring, in order, without gaps or repeats.
func TestHistoryBounded(t *testing.T) {
	ring := NewRingFor(125 * time.Millisecond) // the largest ring: MaxCapacity
	for i := range MaxCapacity + 100 {
		ring.Record(sampleAt(i))
	}
	require.Equal(t, MaxCapacity, ring.Len())
	oldest, newest := 100, MaxCapacity+99
	h := newTestHandler(ring, testInfo, testLive)

	type page struct {
		Samples []struct {
			T   int64   `json:"t"`
			CPU float64 `json:"cpu"`
		} `json:"samples"`
		More bool `json:"more"`
	}
	fetch := func(target string) page {
		t.Helper()
		r := get(t, h, http.MethodGet, target)
		require.Equal(t, http.StatusOK, r.StatusCode, target)
		var p page
		require.NoError(t, json.Unmarshal([]byte(body(t, r)), &p), target)
		return p
	}
	cpus := func(p page) []int {
		out := make([]int, len(p.Samples))
		for i, s := range p.Samples {
			out[i] = int(s.CPU)
		}
		return out
	}
	seq := func(from, n int) []int {
		out := make([]int, n)
		for i := range out {
			out[i] = from + i
		}
		return out
	}

	// Without since: the newest ones.
	p := fetch("/status/history")
	require.Len(t, p.Samples, MaxHistorySamples)
	assert.Equal(t, seq(newest-MaxHistorySamples+1, MaxHistorySamples), cpus(p))
	assert.False(t, p.More)
	p = fetch("/status/history?limit=3")
	assert.Equal(t, seq(newest-2, 3), cpus(p))
	p = fetch("/status/history?limit=999999")
	assert.Len(t, p.Samples, MaxHistorySamples, "a limit above the maximum is lowered to it")

	// With since: the oldest ones after it, and "more" until the end.
	p = fetch("/status/history?since=0&limit=5")
	assert.Equal(t, seq(oldest, 5), cpus(p))
	assert.True(t, p.More)
	var got []int
	cursor, pages := "0", 0
	for {
		p = fetch("/status/history?since=" + cursor)
		pages++
		require.LessOrEqual(t, len(p.Samples), MaxHistorySamples)
		got = append(got, cpus(p)...)
		if !p.More {
			break
		}
		cursor = strconv.FormatInt(p.Samples[len(p.Samples)-1].T, 10)
	}
	assert.Equal(t, seq(oldest, MaxCapacity), got)
	assert.Equal(t, (MaxCapacity+MaxHistorySamples-1)/MaxHistorySamples, pages)

	for _, bad := range []string{"0", "-1", "x", "1.5"} {
		r := get(t, h, http.MethodGet, "/status/history?limit="+bad)
		assert.Equal(t, http.StatusBadRequest, r.StatusCode, bad)
	}
}

// TestHostCheck: a Host that is not an IP address, localhost or the
// configured endpoint's host is refused, as a DNS-rebinding page's would be.
func TestHostCheck(t *testing.T) {
	f := func(endpoint, host string, want int) {
		t.Helper()
		h := Handler(NewRing(4), testInfo, testLive, endpoint)
		for _, target := range []string{"/", "/status", "/status/history", "/nope"} {
			r := getHost(t, h, http.MethodGet, target, host)
			code := r.StatusCode
			if want == http.StatusOK && target == "/nope" {
				assert.Equal(t, http.StatusNotFound, code, "%s %s %s", endpoint, host, target)
				continue
			}
			assert.Equal(t, want, code, "%s %s %s", endpoint, host, target)
			if code == http.StatusForbidden {
				assert.Contains(t, body(t, r), "DNS rebinding")
			}
		}
	}
	const ok, refused = http.StatusOK, http.StatusForbidden
	for _, endpoint := range []string{"localhost:55680", "0.0.0.0:55680", "127.0.0.1:0", "[::]:55680", ":55680", ""} {
		f(endpoint, "localhost:55680", ok)
		f(endpoint, "LOCALHOST.:55680", ok)
		f(endpoint, "localhost", ok)
		f(endpoint, "127.0.0.1:55680", ok)
		f(endpoint, "10.1.2.3:55680", ok) // a pod IP
		f(endpoint, "[::1]:55680", ok)
		f(endpoint, "[::1]", ok)
		f(endpoint, "[fe80::1%25eth0]:55680", ok)
		f(endpoint, "", ok) // HTTP/1.0 without Host: not a browser

		f(endpoint, "attacker.example:55680", refused)
		f(endpoint, "attacker.example", refused)
		f(endpoint, "localhost.attacker.example:55680", refused)
		f(endpoint, "127.0.0.1.attacker.example:55680", refused)
		f(endpoint, "otelcol-0.otelcol.monitoring.svc.cluster.local:55680", refused)
	}
	// The configured host name is accepted, in any case and with a trailing dot.
	f("otelcol-0.otelcol.monitoring.svc.cluster.local:55680", "otelcol-0.otelcol.monitoring.svc.cluster.local:55680", ok)
	f("otelcol-0.otelcol.monitoring.svc.cluster.local:55680", "OTELCOL-0.otelcol.monitoring.svc.cluster.local.", ok)
	f("otelcol-0.otelcol.monitoring.svc.cluster.local:55680", "attacker.example:55680", refused)
}

func TestLiveStatusSample(t *testing.T) {
	l := testLive()
	assert.Equal(t, Sample{
		At:         l.At,
		Levels:     sampleLevelsOf(cpuAndMemory(0.93, 0.84, 0.88, true, 0.5, true)),
		WorkingSet: 0.5, // 256 MiB of 512 MiB
		States:     [decision.NumSignals]decision.State{decision.StateShedding, decision.StateNormal, decision.StateOpen, decision.StateShedding},
		Allowed:    153, Denied: 23,
	}, l.Sample())
}

func TestRouting(t *testing.T) {
	h := newTestHandler(NewRing(4), testInfo, testLive)
	for _, tc := range []struct {
		method, target string
		code           int
		contentType    string
	}{
		{http.MethodGet, "/", 200, "text/html; charset=utf-8"},
		{http.MethodHead, "/", 200, "text/html; charset=utf-8"},
		{http.MethodGet, "/status", 200, "application/json; charset=utf-8"},
		{http.MethodHead, "/status", 200, "application/json; charset=utf-8"},
		{http.MethodGet, "/status/history", 200, "application/json; charset=utf-8"},
		{http.MethodGet, "/status/", 404, "text/plain; charset=utf-8"},
		{http.MethodGet, "/index.html", 404, "text/plain; charset=utf-8"},
		{http.MethodGet, "/status/history/x", 404, "text/plain; charset=utf-8"},
		{http.MethodGet, "/v1/traces", 404, "text/plain; charset=utf-8"},
		{http.MethodPost, "/", 405, "text/plain; charset=utf-8"},
		{http.MethodPost, "/status", 405, "text/plain; charset=utf-8"},
		{http.MethodPut, "/status/history", 405, "text/plain; charset=utf-8"},
		{http.MethodDelete, "/status", 405, "text/plain; charset=utf-8"},
		{http.MethodPost, "/nope", 404, "text/plain; charset=utf-8"},
	} {
		t.Run(tc.method+" "+tc.target, func(t *testing.T) {
			r := get(t, h, tc.method, tc.target)
			assert.Equal(t, tc.code, r.StatusCode)
			assert.Equal(t, tc.contentType, r.Header.Get("Content-Type"))
			if tc.code == http.StatusMethodNotAllowed {
				assert.Equal(t, "GET, HEAD", r.Header.Get("Allow"))
			}
		})
	}
}

func TestUnderStripPrefix(t *testing.T) {
	h := http.StripPrefix("/throttle", newTestHandler(NewRing(4), testInfo, testLive))
	assert.Equal(t, http.StatusOK, get(t, h, http.MethodGet, "/throttle/").StatusCode)
	assert.Equal(t, http.StatusOK, get(t, h, http.MethodGet, "/throttle/status").StatusCode)
}

func TestPageSelfContained(t *testing.T) {
	r := get(t, newTestHandler(NewRing(4), testInfo, testLive), http.MethodGet, "/")
	require.Equal(t, http.StatusOK, r.StatusCode)
	csp := r.Header.Get("Content-Security-Policy")
	assert.Contains(t, csp, "default-src 'none'")
	assert.Contains(t, csp, "connect-src 'self'")
	assert.Equal(t, "nosniff", r.Header.Get("X-Content-Type-Options"))
	page := body(t, r)
	assert.Equal(t, string(pageHTML), page)

	// No absolute URL anywhere (scripts, styles, fonts, images, fetches) and
	// no external resource tags at all: the page works air-gapped.
	assert.NotRegexp(t, `(?i)https?://`, page)
	assert.NotRegexp(t, `(?i)<script[^>]*\ssrc\s*=`, page)
	assert.NotRegexp(t, `(?i)<link\b`, page)
	assert.NotRegexp(t, `(?i)@import|@font-face|url\(`, page)
	assert.NotRegexp(t, `(?i)//[a-z0-9.-]+\.[a-z]{2,}/`, page, "protocol-relative URL")

	// Everything the Chromium test and the page rely on is there.
	for _, id := range []string{"panel-cpu", "panel-mem", "panel-state", "panel-rate"} {
		assert.Regexp(t, `<section[^>]*id="`+id+`"[^>]*data-points="0"`, page)
	}
	assert.Contains(t, page, `fetch(url`)
	assert.Contains(t, page, `"status/history?since="`, "relative URLs, so a path prefix works")
	assert.Contains(t, page, "__throttleRendered")
}
