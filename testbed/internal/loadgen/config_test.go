// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseFlagsDefaults(t *testing.T) {
	cfg, err := ParseFlags(nil, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "http://127.0.0.1:4318", cfg.Target)
	assert.Equal(t, HTTP, cfg.Protocol)
	assert.Equal(t, Proto, cfg.Encoding)
	assert.Equal(t, []Weighted{{Traces, 1}}, cfg.Signals)
	require.Len(t, cfg.Phases, 3)
	assert.Equal(t, Phase{Name: "warmup", Duration: 30 * time.Second, Concurrency: 2, MaxInflight: 512, Items: 50, AttrSize: 256}, cfg.Phases[0])
	assert.Equal(t, Phase{Name: "burst", Duration: 30 * time.Second, Concurrency: 32, MaxInflight: 512, Items: 100, AttrSize: 256}, cfg.Phases[1])
	assert.Equal(t, Phase{Name: "bigpayload", Duration: 30 * time.Second, Concurrency: 32, MaxInflight: 512, Items: 500, AttrSize: 256}, cfg.Phases[2])
}

func TestParseFlagsAll(t *testing.T) {
	cfg, err := ParseFlags([]string{
		"-protocol", "grpc", "-target", "localhost:14317", "-gzip", "-signals", "traces:8,metrics:1,logs:1",
		"-c", "64", "-warmup-c", "3", "-d", "90s", "-warmup-d", "10s", "-warmup-spans", "10", "-burst-spans", "20",
		"-bigpayload-spans", "30", "-attr-size", "100", "-bigpayload-attr-size", "4096", "-rate", "250.5",
		"-max-inflight", "128", "-csv", "x.csv", "-phases", "burst,bigpayload", "-timeout", "3s",
		"-H", "X-Tenant: a", "-H", "x-tenant:b", "-H", "Authorization: Bearer t:k", "-grpc-conns", "2",
	}, io.Discard)
	require.NoError(t, err)
	assert.Equal(t, "localhost:14317", cfg.Target)
	assert.Equal(t, GRPC, cfg.Protocol)
	assert.True(t, cfg.Gzip)
	assert.Equal(t, []Weighted{{Traces, 8}, {Metrics, 1}, {Logs, 1}}, cfg.Signals)
	assert.Equal(t, http.Header{"X-Tenant": {"a", "b"}, "Authorization": {"Bearer t:k"}}, cfg.Headers)
	assert.Equal(t, "x.csv", cfg.CSVPath)
	assert.Equal(t, 3*time.Second, cfg.Timeout)
	assert.Equal(t, 2, cfg.GRPCConns)
	assert.Equal(t, []Phase{
		{Name: "burst", Duration: 90 * time.Second, Concurrency: 64, Rate: 250.5, MaxInflight: 128, Items: 20, AttrSize: 100},
		{Name: "bigpayload", Duration: 90 * time.Second, Concurrency: 64, Rate: 250.5, MaxInflight: 128, Items: 30, AttrSize: 4096},
	}, cfg.Phases)
}

func TestParseFlagsTargets(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-target", "http://localhost:4318/"}, "http://localhost:4318"},
		{[]string{"-target", "http://[::1]:4318"}, "http://[::1]:4318"},
		{[]string{"-target", "http://127.0.0.2:4318"}, "http://127.0.0.2:4318"},
		{[]string{"-protocol", "grpc"}, "127.0.0.1:4317"},
		{[]string{"-protocol", "grpc", "-target", "http://127.0.0.1:4317"}, "127.0.0.1:4317"},
		{[]string{"-target", "http://10.1.2.3:4318", "-allow-remote"}, "http://10.1.2.3:4318"},
	} {
		cfg, err := ParseFlags(tc.args, io.Discard)
		require.NoError(t, err, tc.args)
		assert.Equal(t, tc.want, cfg.Target, tc.args)
	}
}

func TestParseFlagsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-target", "http://10.1.2.3:4318"}, "not localhost"},
		{[]string{"-target", "http://example.com:4318"}, "not localhost"},
		{[]string{"-protocol", "grpc", "-target", "example.com:4317"}, "not localhost"},
		{[]string{"-protocol", "grpc", "-target", "127.0.0.1"}, "want host:port"},
		{[]string{"-target", "127.0.0.1:4318"}, "want http://host:port"},
		{[]string{"-protocol", "udp"}, "want http or grpc"},
		{[]string{"-encoding", "xml"}, "want proto or json"},
		{[]string{"-signals", "spans"}, "unknown signal"},
		{[]string{"-signals", "traces:x"}, "must be an integer"},
		{[]string{"-signals", "traces,traces"}, "twice"},
		{[]string{"-signals", "traces:0"}, "no signal"},
		{[]string{"-phases", "warmup,soak"}, "unknown phase"},
		{[]string{"-d", "0s"}, "duration must be > 0"},
		{[]string{"-c", "0"}, "concurrency must be >= 1"},
		{[]string{"-rate", "10", "-max-inflight", "0"}, "max-inflight"},
		{[]string{"-burst-spans", "0"}, "items per request"},
		{[]string{"-H", "novalue"}, "Name: value"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"-nope"}, "not defined"},
	} {
		_, err := ParseFlags(tc.args, io.Discard)
		require.Error(t, err, tc.args)
		assert.ErrorContains(t, err, tc.want, tc.args)
	}
}

func TestInterleave(t *testing.T) {
	assert.Equal(t, []Signal{Traces, Metrics, Traces}, interleave([]Weighted{{Traces, 2}, {Metrics, 1}}))
	got := interleave([]Weighted{{Traces, 8}, {Metrics, 1}, {Logs, 1}})
	require.Len(t, got, 10)
	n := map[Signal]int{}
	for _, s := range got {
		n[s]++
	}
	assert.Equal(t, map[Signal]int{Traces: 8, Metrics: 1, Logs: 1}, n)
}
