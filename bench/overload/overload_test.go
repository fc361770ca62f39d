package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
)

func TestRenderConfig(t *testing.T) {
	for _, c := range []colConfig{
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, Throttle: true, Thresholds: "default"},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, Throttle: true, Thresholds: "benchmark"},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, MemoryLimiter: true},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, PprofPort: 4},
		{GRPCPort: 1, HTTPPort: 2, MetricsPort: 3, Throttle: true, Thresholds: "default", PprofPort: 4},
	} {
		b, err := renderConfig(c)
		require.NoError(t, err)
		ret, err := confmap.NewRetrievedFromYAML(b)
		require.NoError(t, err, string(b))
		conf, err := ret.AsConf()
		require.NoError(t, err, string(b))
		assert.Equal(t, "127.0.0.1:2", conf.Get("receivers::otlp::protocols::http::endpoint"))
		assert.Equal(t, "127.0.0.1:1", conf.Get("receivers::otlp::protocols::grpc::endpoint"))
		assert.Equal(t, 3, conf.Get("service::telemetry::metrics::readers").([]any)[0].(map[string]any)["pull"].(map[string]any)["exporter"].(map[string]any)["prometheus"].(map[string]any)["port"])
		for _, p := range []string{"traces", "metrics", "logs"} {
			want := []any{"batch"}
			if c.MemoryLimiter {
				want = []any{"memory_limiter", "batch"}
			}
			assert.Equal(t, want, conf.Get("service::pipelines::"+p+"::processors"), p)
			assert.Equal(t, []any{"nop"}, conf.Get("service::pipelines::"+p+"::exporters"), p)
		}
		assert.Equal(t, c.Throttle, conf.IsSet("extensions::throttle"))
		assert.Equal(t, c.Throttle, conf.IsSet("receivers::otlp::protocols::http::middlewares"))
		if c.Throttle {
			assert.Equal(t, false, conf.Get("extensions::throttle::rules::metrics::enabled"))
		}
		if c.Thresholds == "benchmark" {
			assert.Equal(t, 1.2, conf.Get("extensions::throttle::thresholds::cpu::hard"))
		}
		var exts []any
		if c.Throttle {
			exts = append(exts, "throttle")
		}
		if c.PprofPort != 0 {
			exts = append(exts, "pprof")
			assert.Equal(t, "127.0.0.1:4", conf.Get("extensions::pprof::endpoint"))
		} else {
			assert.False(t, conf.IsSet("extensions::pprof"))
		}
		if exts == nil {
			assert.False(t, conf.IsSet("service::extensions"), string(b))
		} else {
			assert.Equal(t, exts, conf.Get("service::extensions"), string(b))
		}
	}
}

func TestParseGoroutineTotal(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
		ok   bool
	}{
		{"goroutine profile: total 137\n42 @ 0x43e1ce 0x44f2a5\n#\t0x43e1cd\truntime.gopark+0xcd\n", 137, true},
		{"goroutine profile: total 5\r\n", 5, true},
		{"goroutine profile: total 0", 0, true}, // no newline: EOF after the line
		{"goroutine profile: total  12 \n", 12, true},
		{"", 0, false},
		{"\n", 0, false},
		{"goroutine profile: total\n", 0, false},
		{"goroutine profile: total -3\n", 0, false},
		{"goroutine profile: total 1e3\n", 0, false},
		{"goroutine profile: total 99999999999999999999999\n", 0, false},
		{"goroutine 1 [running]:\nmain.main()\n", 0, false}, // debug=2
		{"<html>404 page not found</html>\n", 0, false},
		{"\x1f\x8b\x08\x00binary", 0, false}, // debug=0: gzipped protobuf
		{strings.Repeat("x", 10000), 0, false},
	} {
		n, err := parseGoroutineTotal(strings.NewReader(tc.in))
		if tc.ok {
			require.NoError(t, err, "%q", tc.in)
			assert.Equal(t, tc.want, n, "%q", tc.in)
		} else {
			assert.Error(t, err, "%q", tc.in)
		}
	}
}

func TestParseExposition(t *testing.T) {
	text := `# HELP otelcol_throttle_state State.
# TYPE otelcol_throttle_state gauge
otelcol_throttle_state{otel_scope_name="x",signal="traces"} 2
otelcol_throttle_state{signal="metrics"} 0
otelcol_throttle_requests_total{decision="denied",protocol="http",reason="shed",signal="traces"} 10
otelcol_throttle_requests_total{decision="denied",protocol="grpc",reason="shed",signal="traces"} 5
otelcol_throttle_requests_total{decision="allowed",protocol="http",signal="traces"} 7
otelcol_process_runtime_heap_alloc_bytes 1.5e+07
weird{a="x\"y,z"} 3
`
	s := parseExposition(text)
	v, ok := sum(s, "otelcol_throttle_state", map[string]string{"signal": "traces"})
	assert.True(t, ok)
	assert.Equal(t, 2.0, v)
	v, ok = sum(s, "otelcol_throttle_requests", map[string]string{"decision": "denied", "reason": "shed"})
	assert.True(t, ok)
	assert.Equal(t, 15.0, v)
	v, _ = sum(s, "otelcol_process_runtime_heap_alloc_bytes", nil)
	assert.Equal(t, 1.5e7, v)
	v, ok = sum(s, "weird", map[string]string{"a": `x"y,z`})
	assert.True(t, ok)
	assert.Equal(t, 3.0, v)
	_, ok = sum(s, "otelcol_throttle_state", map[string]string{"signal": "logs"})
	assert.False(t, ok)
}

// TestResolve: v1 with cpu and cpuacct mounted apart and memory under a
// sandbox path (this machine's layout), a hybrid host, and pure v2.
func TestResolve(t *testing.T) {
	root := t.TempDir()
	put := func(p, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), []byte(s), 0o644))
	}
	put("proc/self/mountinfo", `30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/cpuacct rw,relatime shared:10 - cgroup cgroup rw,cpuacct
33 25 0:29 / /sys/fs/cgroup/memory rw,relatime shared:12 - cgroup cgroup rw,memory
38 25 0:34 / /sys/fs/cgroup/unified rw,relatime shared:17 - cgroup2 cgroup2 rw
`)
	put("proc/self/cgroup", "4:memory:/process_api/abc\n2:cpuacct:/\n1:cpu:/\n0::/\n")
	v, cpu, acct, mem, err := resolve(root)
	require.NoError(t, err)
	assert.Equal(t, 1, v)
	assert.Equal(t, filepath.Join(root, "sys/fs/cgroup/cpu"), cpu)
	assert.Equal(t, filepath.Join(root, "sys/fs/cgroup/cpuacct"), acct)
	assert.Equal(t, filepath.Join(root, "sys/fs/cgroup/memory/process_api/abc"), mem)

	root = t.TempDir()
	put("proc/self/mountinfo", "29 23 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
	put("proc/self/cgroup", "0::/user.slice/s.scope\n")
	put("sys/fs/cgroup/user.slice/s.scope/cgroup.controllers", "cpuset cpu io memory pids\n")
	v, cpu, _, mem, err = resolve(root)
	require.NoError(t, err)
	assert.Equal(t, 2, v)
	assert.Equal(t, filepath.Join(root, "sys/fs/cgroup/user.slice/s.scope"), cpu)
	assert.Equal(t, cpu, mem)
}
