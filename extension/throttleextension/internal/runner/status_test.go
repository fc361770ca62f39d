// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/confighttp"
	"go.opentelemetry.io/collector/config/confignet"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// testConfig is the runner's configuration for the extension's defaults,
// as far as the tests here use it: the default lines and rules, a 250ms
// interval, no status page, nothing reported.
func testConfig(mutate ...func(*Config)) Config {
	cfg := Config{
		Enabled:       true,
		Sampler:       sampler.Config{Interval: 250 * time.Millisecond},
		Decision:      decision.DefaultConfig(),
		RetryAfterMin: time.Second,
		RetryAfterMax: 5 * time.Second,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	return cfg
}

// newTestRunner creates (but does not start) a runner; Shutdown runs at
// cleanup.
func newTestRunner(t *testing.T, cfg Config) *Runner {
	t.Helper()
	r, err := New(cfg, componenttest.NewNopTelemetrySettings(), component.MustNewID("throttle"), Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Shutdown(context.Background())) })
	return r
}

// statusHost is a host that records the component status events reported to
// it, as the service's host does.
type statusHost struct {
	component.Host
	mu     sync.Mutex
	events []*componentstatus.Event
	ch     chan *componentstatus.Event
}

var _ componentstatus.Reporter = (*statusHost)(nil)

func newStatusHost() *statusHost {
	return &statusHost{Host: componenttest.NewNopHost(), ch: make(chan *componentstatus.Event, 100)}
}

func (h *statusHost) Report(ev *componentstatus.Event) {
	h.mu.Lock()
	h.events = append(h.events, ev)
	h.mu.Unlock()
	h.ch <- ev
}

func (h *statusHost) recorded() []*componentstatus.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*componentstatus.Event(nil), h.events...)
}

// next waits for the next reported event; the timeout only bounds a failing
// test.
func (h *statusHost) next(t *testing.T) *componentstatus.Event {
	t.Helper()
	select {
	case ev := <-h.ch:
		return ev
	case <-time.After(10 * time.Second):
		require.FailNow(t, "no component status event reported")
		return nil
	}
}

func TestStatusPageOff(t *testing.T) {
	r := newTestRunner(t, testConfig())
	assert.Nil(t, r.status.ring)
	assert.Nil(t, r.status.server)
	assert.Nil(t, r.StatusAddr())
}

// The sampler goroutine records into the ring and checks for a status
// change on every sample: without a change it must not allocate.
func TestStatusRecordDoesNotAllocate(t *testing.T) {
	r := newTestRunner(t, testConfig(func(c *Config) {
		c.ReportStatus = true
		c.Status = &confighttp.ServerConfig{NetAddr: confignet.AddrConfig{Endpoint: "127.0.0.1:0", Transport: confignet.TransportTypeTCP}}
	}))
	wl := &sampler.WaterLevel{Mem: 0.5, MemValid: true, At: time.Now()}
	allocs := testing.AllocsPerRun(100, func() {
		r.status.record(wl)
		r.Record(middleware.ProtocolHTTP, decision.Traces, decision.Admit)
	})
	assert.Zero(t, allocs)
	assert.Positive(t, r.status.ring.Len())
	require.NoError(t, r.Shutdown(context.Background()))
}

// The stale fallback turns every signal Normal without a sample; whoever
// triggers it calls reportChange, which then reports OK: a throttle that
// admits everything must not keep the component in error.
func TestReportStatusStaleFallback(t *testing.T) {
	r := newTestRunner(t, testConfig(func(c *Config) { c.ReportStatus = true }))
	host := newStatusHost()
	r.status.host = host // as Start does; the engine is driven by hand below

	r.engine.Observe(&sampler.WaterLevel{Mem: 0.95, MemValid: true, At: time.Now()})
	r.status.reportChange()
	require.Equal(t, componentstatus.StatusRecoverableError, host.next(t).Status())
	r.status.reportChange() // no change, no report

	require.Eventually(t, func() bool { return r.engine.Expire(time.Nanosecond) }, 10*time.Second, time.Millisecond)
	live := r.status.live()
	assert.True(t, live.Stale)
	for _, s := range live.Signals {
		assert.Equal(t, decision.Normal, s.State)
		assert.Zero(t, s.DropProbability)
	}
	r.status.reportChange()
	require.Equal(t, componentstatus.StatusOK, host.next(t).Status())

	// Once Shutdown has begun nothing is reported (the host is Stopping).
	r.engine.Observe(&sampler.WaterLevel{Mem: 0.95, MemValid: true, At: time.Now()})
	require.NoError(t, r.Shutdown(context.Background()))
	r.status.reportChange()
	assert.Len(t, host.recorded(), 2)
}
