// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package downstream

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// queues serves the exporter helper's queue gauges, as a collector does,
// with sizes the test sets.
type queues struct {
	mu    sync.Mutex
	sizes map[string]int // exporter -> size, capacity 100, traces
	code  int
	hang  chan struct{}
	reads atomic.Int64
}

func (q *queues) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	q.reads.Add(1)
	if q.hang != nil {
		select {
		case <-q.hang:
		case <-r.Context().Done():
		}
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.code != 0 {
		w.WriteHeader(q.code)
		return
	}
	for e, n := range q.sizes {
		fmt.Fprintf(w, "otelcol_exporter_queue_size{data_type=\"traces\",exporter=%q} %d\n", e, n)
		fmt.Fprintf(w, "otelcol_exporter_queue_capacity{data_type=\"traces\",exporter=%q} 100\n", e)
	}
}

func (q *queues) set(e string, n int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.sizes[e] = n
}

func startMeter(t *testing.T, q *queues, mut func(*Config), opts Options) *Meter {
	t.Helper()
	srv := httptest.NewServer(q)
	t.Cleanup(srv.Close)
	cfg := DefaultConfig()
	cfg.Enabled, cfg.Endpoint, cfg.Interval = true, srv.URL+"/metrics", minInterval
	if mut != nil {
		mut(&cfg)
	}
	require.NoError(t, cfg.Validate())
	m := New(cfg, opts)
	m.Start()
	t.Cleanup(m.Stop)
	return m
}

// level waits for a valid level that is not carried over and returns its value.
func eventuallyLevel(t *testing.T, m *Meter, want float64) {
	t.Helper()
	require.Eventually(t, func() bool {
		l := m.Read(nil)
		return l.Valid && l.Value == want && l.Slow == want && l.Fast == want
	}, 5*time.Second, 5*time.Millisecond, "downstream level never reached %v", want)
}

func TestMeterFollowsTheFullestQueue(t *testing.T) {
	q := &queues{sizes: map[string]int{"otlp/a": 10, "otlp/b": 30}}
	m := startMeter(t, q, nil, Options{})
	eventuallyLevel(t, m, 0.3)
	q.set("otlp/a", 90)
	eventuallyLevel(t, m, 0.9)
	full, ok := m.Fullest()
	require.True(t, ok)
	assert.Equal(t, "otlp/a", full.Exporter)
	q.set("otlp/a", 0)
	q.set("otlp/b", 0)
	eventuallyLevel(t, m, 0)
}

func TestMeterOnlyTheConfiguredExporters(t *testing.T) {
	q := &queues{sizes: map[string]int{"otlp/a": 10, "debug/b": 95}}
	m := startMeter(t, q, func(c *Config) { c.Exporters = []string{"otlp/a"} }, Options{})
	eventuallyLevel(t, m, 0.1)
}

func TestMeterCarriesARepeatedReading(t *testing.T) {
	q := &queues{sizes: map[string]int{"otlp/a": 50}}
	m := startMeter(t, q, func(c *Config) { c.Interval = maxInterval }, Options{})
	require.Eventually(t, func() bool { return m.Read(nil).Valid }, 5*time.Second, time.Millisecond)
	l := m.Read(nil)
	assert.True(t, l.Valid)
	assert.True(t, l.Carried, "a second Read before the next read is no new frame")
}

func TestMeterUnknownWhenReadsFail(t *testing.T) {
	q := &queues{sizes: map[string]int{"otlp/a": 50}}
	core, logs := observer.New(zap.WarnLevel)
	var failures atomic.Int64
	m := startMeter(t, q, nil, Options{Logger: zap.New(core), OnError: func(error) { failures.Add(1) }})
	eventuallyLevel(t, m, 0.5)
	q.mu.Lock()
	q.code = http.StatusServiceUnavailable
	q.mu.Unlock()
	require.Eventually(t, func() bool { return !m.Read(nil).Valid }, 5*time.Second, 5*time.Millisecond,
		"a level that can no longer be read must stop counting")
	require.Eventually(t, func() bool { return failures.Load() >= 3 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 1, logs.FilterMessageSnippet("cannot read the exporters' queues").Len(), "warned once, not at every read")
}

func TestMeterNoQueue(t *testing.T) {
	f := func(sizes map[string]int, exporters []string, want string) {
		t.Helper()
		q := &queues{sizes: sizes}
		errs := make(chan error, 100)
		m := startMeter(t, q, func(c *Config) { c.Exporters = exporters }, Options{OnError: func(err error) {
			select {
			case errs <- err:
			default:
			}
		}})
		err := <-errs
		require.ErrorIs(t, err, ErrNoQueue)
		assert.Contains(t, err.Error(), want)
		assert.False(t, m.Read(nil).Valid)
	}
	f(map[string]int{}, nil, "is sending_queue enabled")
	f(map[string]int{"otlp/a": 1}, []string{"otlp/typo"}, "of otlp/typo (exporters with a queue: otlp/a)")
}

func TestMeterStopDoesNotWaitForTheEndpoint(t *testing.T) {
	q := &queues{hang: make(chan struct{})}
	defer close(q.hang)
	m := startMeter(t, q, func(c *Config) { c.Interval = maxInterval }, Options{})
	require.Eventually(t, func() bool { return q.reads.Load() > 0 }, 5*time.Second, time.Millisecond)
	stopped := make(chan struct{})
	go func() { m.Stop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second): // the read's own timeout is 10s at this interval
		t.Fatal("Stop waited for a read that hangs")
	}
	m.Stop() // twice is safe
}

func TestMeterDisabledReadsNothing(t *testing.T) {
	q := &queues{sizes: map[string]int{"otlp/a": 50}}
	srv := httptest.NewServer(q)
	defer srv.Close()
	cfg := DefaultConfig()
	cfg.Endpoint = srv.URL
	m := New(cfg, Options{})
	m.Start()
	defer m.Stop()
	assert.False(t, m.Read(nil).Valid)
	assert.Zero(t, q.reads.Load(), "a disabled meter makes no request")
}
