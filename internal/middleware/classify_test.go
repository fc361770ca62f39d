// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

func TestClassifyHTTP(t *testing.T) {
	c := mustClassifier(t, Routes{HTTP: map[string]decision.Signal{
		"/prometheus/write":  decision.SignalMetrics,
		"/api/v2/spans/":     decision.SignalTraces, // stored cleaned
		"/loki/api/v1/push":  decision.SignalLogs,
		"/v1/logs":           decision.SignalTraces, // a user route overrides a built-in
		"/custom/traces/ing": decision.SignalTraces,
	}})
	long := "/" + strings.Repeat("a/", 1<<20) + "v1/traces"
	tests := []struct {
		path string
		sig  decision.Signal
		ok   bool
	}{
		{"/v1/traces", decision.SignalTraces, true},
		{"/v1/metrics", decision.SignalMetrics, true},
		{"/v1/logs", decision.SignalTraces, true},
		{"/v1development/profiles", decision.SignalProfiles, true},
		{"/prometheus/write", decision.SignalMetrics, true},
		{"/api/v2/spans", decision.SignalTraces, true},
		{"/api/v2/spans/", decision.SignalTraces, true},
		{"/loki/api/v1/push", decision.SignalLogs, true},
		// Path tricks all land on the route.
		{"//v1/traces", decision.SignalTraces, true},
		{"/v1//traces", decision.SignalTraces, true},
		{"/v1/traces/", decision.SignalTraces, true},
		{"/v1/traces//", decision.SignalTraces, true},
		{"/v1/./traces", decision.SignalTraces, true},
		{"/./v1/traces", decision.SignalTraces, true},
		{"/v1/traces/.", decision.SignalTraces, true},
		{"/v1/x/../traces", decision.SignalTraces, true},
		{"/../v1/traces", decision.SignalTraces, true},
		{"/v1/traces/x/..", decision.SignalTraces, true},
		{"v1/traces", decision.SignalTraces, true}, // not rooted: rooted before cleaning
		{"/" + strings.Repeat("/", 10000) + "v1/metrics", decision.SignalMetrics, true},
		{"/" + strings.Repeat("x/../", 10000) + "v1/metrics", decision.SignalMetrics, true},
		// Decoded percent-encoding (what r.URL.Path holds): see url tests below.
		// Not routes.
		{"/", 0, false},
		{"", 0, false},
		{".", 0, false},
		{"/v1", 0, false},
		{"/v1/trace", 0, false},
		{"/v1/tracesx", 0, false},
		{"/v1/traces/x", 0, false},
		{"/V1/TRACES", 0, false}, // routing is case-sensitive
		{"/health", 0, false},
		{"/v1/traces\x00", 0, false},
		{"/x/v1/traces", 0, false},
		{long, 0, false},
		{"/" + strings.Repeat("v", 1<<20), 0, false},
	}
	for _, tt := range tests {
		name := tt.path
		if len(name) > 40 {
			name = name[:40] + "..."
		}
		t.Run(name, func(t *testing.T) {
			sig, ok := c.HTTP(tt.path)
			assert.Equal(t, tt.ok, ok)
			if tt.ok {
				assert.Equal(t, tt.sig, sig)
			}
		})
	}
}

// TestClassifyHTTPFromURL goes through net/url as the server does: the
// classifier sees the decoded path, the query never.
func TestClassifyHTTPFromURL(t *testing.T) {
	c := mustClassifier(t, Routes{})
	tests := []struct {
		target string
		ok     bool
	}{
		{"/v1/traces?x=1", true},
		{"/v1/traces?/v1/metrics", true},
		{"/v1/metrics?q=/v1/traces", true},
		{"/v1/%74races", true},   // encoded letter
		{"/v1%2Ftraces", true},   // encoded slash: decoded, so it is throttled like traces
		{"/v1/%2E/traces", true}, // encoded dot segment, cleaned after decoding
		{"/%2Fv1/traces", true},  // encoded double slash
		{"/v1/traces%2F", true},  // encoded trailing slash
		{"/v1/traces%00", false}, // NUL is a different path
		{"/v1/traces%20", false}, // so is a trailing space
		{"/health?/v1/traces", false},
		{"/v1/traces#frag", false}, // servers keep "#" in the path; ServeMux 404s it too
	}
	for _, tt := range tests {
		t.Run(tt.target, func(t *testing.T) {
			u, err := url.ParseRequestURI(tt.target)
			require.NoError(t, err)
			sig, ok := c.HTTP(u.Path)
			assert.Equal(t, tt.ok, ok, "path %q", u.Path)
			if tt.ok {
				assert.NotEqual(t, decision.SignalProfiles, sig)
			}
		})
	}
}

func TestClassifyGRPC(t *testing.T) {
	c := mustClassifier(t, Routes{GRPC: map[string]decision.Signal{
		"/my.pkg.Service/Push": decision.SignalLogs,
	}})
	for m, want := range DefaultRoutes().GRPC {
		got, ok := c.GRPC(m)
		assert.True(t, ok, m)
		assert.Equal(t, want, got, m)
	}
	got, ok := c.GRPC("/my.pkg.Service/Push")
	assert.True(t, ok)
	assert.Equal(t, decision.SignalLogs, got)
	for _, m := range []string{
		"", "/", "//opentelemetry.proto.collector.trace.v1.TraceService/Export",
		"/opentelemetry.proto.collector.trace.v1.TraceService/Export/",
		"/opentelemetry.proto.collector.trace.v1.TraceService/export",
		"opentelemetry.proto.collector.trace.v1.TraceService/Export",
		"/grpc.health.v1.Health/Check",
	} {
		_, ok := c.GRPC(m)
		assert.False(t, ok, m)
	}
}

func TestNewClassifierErrors(t *testing.T) {
	for name, r := range map[string]Routes{
		"relative http":    {HTTP: map[string]decision.Signal{"v1/x": decision.SignalLogs}},
		"empty http":       {HTTP: map[string]decision.Signal{"": decision.SignalLogs}},
		"bad signal http":  {HTTP: map[string]decision.Signal{"/x": decision.NumSignals}},
		"conflict http":    {HTTP: map[string]decision.Signal{"/x": decision.SignalLogs, "/x/": decision.SignalTraces}},
		"bad grpc":         {GRPC: map[string]decision.Signal{"pkg.S/M": decision.SignalLogs}},
		"no method grpc":   {GRPC: map[string]decision.Signal{"/pkg.S/": decision.SignalLogs}},
		"no service grpc":  {GRPC: map[string]decision.Signal{"//M": decision.SignalLogs}},
		"extra slash grpc": {GRPC: map[string]decision.Signal{"/a/b/c": decision.SignalLogs}},
		"bad signal grpc":  {GRPC: map[string]decision.Signal{"/a/b": 200}},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := NewClassifier(r)
			assert.Error(t, err)
		})
	}
	// The same path twice with the same signal is fine.
	_, err := NewClassifier(Routes{HTTP: map[string]decision.Signal{"/x": decision.SignalLogs, "/x/": decision.SignalLogs}})
	assert.NoError(t, err)
}

func TestCheckGRPCRoute(t *testing.T) {
	for m, want := range map[string]bool{
		"/my.pkg.Service/Push": true,
		"/Service/Method":      true,
		"/opentelemetry.proto.collector.trace.v1.TraceService/Export": true,
		"":                    false,
		"/":                   false,
		"//":                  false,
		"/a.B/C/D":            false,
		"/.a.B/C":             false,
		"/a..B/C":             false,
		"/a.B./C":             false,
		"/a B/C":              false,
		"/a.B/C.D":            false,
		"my.pkg.Service/Push": false,
	} {
		if want {
			require.NoError(t, CheckGRPCRoute(m), m)
		} else {
			require.ErrorIs(t, CheckGRPCRoute(m), ErrRouteMethod, m)
		}
	}
}

func TestCheckHTTPRoute(t *testing.T) {
	for p, want := range map[string]error{
		"/prometheus/write": nil,
		"/":                 nil,
		"x/y":               ErrRouteNotRooted,
		"":                  ErrRouteNotRooted,
		"/q?x=1":            ErrRouteQuery,
		"/a#b":              ErrRouteQuery,
		"/a//b":             ErrRouteUnclean,
		"/a/":               ErrRouteUnclean,
		"/a/./b":            ErrRouteUnclean,
	} {
		if want == nil {
			require.NoError(t, CheckHTTPRoute(p), p)
		} else {
			require.ErrorIs(t, CheckHTTPRoute(p), want, p)
		}
	}
	assert.EqualError(t, CheckHTTPRoute("/a//b"), `path must be clean, want "/a/b"`)
}

func TestIsCleanPathMatchesPathClean(t *testing.T) {
	for _, p := range []string{
		"/", "/a", "/a/b", "//", "/a/", "/a//b", "/./a", "/a/.", "/a/..", "/..", "/.", "/...", "/a/.b",
		"/a/b.", "/..a", "a", "", "/a/./b", "/a/../b", "/a/..b", "/a/...", "/./", "/a/./", "/.a", "/a/.", "/a/..", "/a/..//",
	} {
		assert.Equal(t, strings.HasPrefix(p, "/") && path.Clean(p) == p, isCleanPath(p), "%q", p)
	}
}

// TestClassifyHTTPAllocs: an already clean path, matched or not, costs no
// allocation.
func TestClassifyHTTPAllocs(t *testing.T) {
	c := mustClassifier(t, Routes{})
	for _, p := range []string{"/v1/traces", "/v1development/profiles", "/health", "/" + strings.Repeat("x", 4096)} {
		allocs := testing.AllocsPerRun(100, func() { c.HTTP(p) })
		assert.Zero(t, allocs, p)
	}
	allocs := testing.AllocsPerRun(100, func() {
		c.GRPC("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
	})
	assert.Zero(t, allocs)
}

func FuzzClassifyHTTP(f *testing.F) {
	for _, s := range []string{"/v1/traces", "//v1/traces", "/v1/./traces", "/v1/x/../traces", "/v1/traces/", "", "/", "..", "/v1%2Ftraces"} {
		f.Add(s)
	}
	c, err := NewClassifier(Routes{HTTP: map[string]decision.Signal{"/prometheus/write": decision.SignalMetrics}})
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, p string) {
		sig, ok := c.HTTP(p)
		// Classification depends only on the cleaned, rooted path.
		want, wantOK := c.http[path.Clean("/"+p)]
		if ok != wantOK || sig != want {
			t.Fatalf("HTTP(%q) = %v, %v; cleaned lookup %v, %v", p, sig, ok, want, wantOK)
		}
	})
}
