// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"context"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/softlimit"
)

// hangingSource stands in for this process's cgroup: a memory limit far
// above anything the test allocates, so the soft limit it leads to never
// binds, and a CPU time read that hangs, as one stuck in the kernel would,
// once hang has been called. It records Close.
type hangingSource struct {
	mu      sync.Mutex
	gate    chan struct{} // non-nil: reads wait for it
	reading bool          // a read is in progress
	blocked chan struct{} // one send when a read starts waiting
	closed  atomic.Bool
	// closedReading: Close ran while a read was in progress.
	closedReading atomic.Bool
}

func newHangingSource() *hangingSource { return &hangingSource{blocked: make(chan struct{}, 1)} }

func (h *hangingSource) CPUTime() (time.Duration, error) {
	h.mu.Lock()
	g := h.gate
	h.reading = true
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.reading = false
		h.mu.Unlock()
	}()
	if g != nil {
		select {
		case h.blocked <- struct{}{}:
		default:
		}
		<-g
	}
	return time.Second, nil
}

func (h *hangingSource) WorkingSet() (uint64, error) { return 64 << 20, nil }

func (h *hangingSource) Limits() (cgroup.Limits, error) {
	return cgroup.Limits{QuotaCores: 1, MemLimit: 1 << 40}, nil
}

func (h *hangingSource) Describe() string { return "hanging source (test)" }

func (h *hangingSource) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closedReading.Store(h.reading)
	h.closed.Store(true)
	return nil
}

// hang makes the next CPU time read wait and returns once the sampler is
// waiting in it; the returned func lets it return (idempotent, and run at
// cleanup too, before the runner's Shutdown).
func (h *hangingSource) hang(t *testing.T) (release func()) {
	t.Helper()
	gate := make(chan struct{})
	h.mu.Lock()
	h.gate = gate
	h.mu.Unlock()
	var once sync.Once
	release = func() {
		once.Do(func() {
			h.mu.Lock()
			h.gate = nil
			h.mu.Unlock()
			close(gate)
		})
	}
	t.Cleanup(release)
	select {
	case <-h.blocked:
	case <-time.After(10 * time.Second):
		require.FailNow(t, "the sampler never read the CPU time")
	}
	return release
}

// gcPercent is the GC percent in force (GOGC).
func gcPercent() uint64 {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// startOwningRunner starts a runner that reads src as this process's own
// source and owns the runtime's soft memory limit and GC percent (the real
// ones: they are what must be given back). Shutdown runs at cleanup.
func startOwningRunner(t *testing.T, src *hangingSource) *Runner {
	t.Helper()
	if os.Getenv("GOMEMLIMIT") != "" || os.Getenv("GOGC") != "" {
		t.Skip("GOMEMLIMIT or GOGC is set: the throttle would own neither runtime setting")
	}
	require.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "no soft memory limit before the test")
	require.Equal(t, uint64(100), gcPercent(), "GOGC's default before the test")
	t.Cleanup(func() {
		// Only a failed test leaves them set; the tests after it need them back.
		debug.SetMemoryLimit(math.MaxInt64)
		debug.SetGCPercent(100)
	})
	cfg := testConfig(func(c *Config) {
		c.Sampler.Interval = 10 * time.Millisecond
		c.GoMemLimit = softlimit.Config{Enabled: true, Share: softlimit.DefaultShare, HeapTarget: softlimit.DefaultHeapTarget}
	})
	r, err := New(cfg, componenttest.NewNopTelemetrySettings(), component.MustNewID("throttle"), Options{ProcessSource: src})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Shutdown(context.Background())) })
	require.NoError(t, r.Start(context.Background(), componenttest.NewNopHost()))
	// The first sample, taken inside Start, set both.
	memLimit, _ := src.Limits()
	require.Equal(t, int64(float64(memLimit.MemLimit)*softlimit.DefaultShare), debug.SetMemoryLimit(-1), "the soft limit follows the source's memory limit")
	require.Greater(t, gcPercent(), uint64(100), "the GC percent is raised while little is live")
	return r
}

// TestShutdownTimeoutReleases: a Shutdown whose ctx ends while a source read
// hangs still gives the soft memory limit and the GC percent back at once,
// so that a configuration reload without the extension is not left with
// them; the source is closed once the read returns, not under it, without
// another Shutdown.
func TestShutdownTimeoutReleases(t *testing.T) {
	src := newHangingSource()
	r := startOwningRunner(t, src)
	release := src.hang(t)

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := r.Shutdown(ctx)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorContains(t, err, "sampler did not stop")
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "soft memory limit given back")
	assert.Equal(t, uint64(100), gcPercent(), "GC percent given back")
	assert.False(t, src.closed.Load(), "the source is not closed under a read in progress")

	release()
	require.Eventually(t, src.closed.Load, 10*time.Second, time.Millisecond, "the source is closed once the read returns")
	assert.False(t, src.closedReading.Load())
	require.NoError(t, r.Shutdown(context.Background()))
	assert.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "a late sample sets nothing")
	assert.Equal(t, uint64(100), gcPercent())
}

// TestSecondShutdownCompletes: while the read hangs, every later Shutdown
// reports that the sampler has not stopped rather than success, and gives
// up when its own ctx ends even while another Shutdown is waiting; once the
// read returns, a Shutdown completes.
func TestSecondShutdownCompletes(t *testing.T) {
	src := newHangingSource()
	r := startOwningRunner(t, src)
	release := src.hang(t)

	shutdownWithin := func(d time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		return r.Shutdown(ctx)
	}
	require.ErrorIs(t, shutdownWithin(20*time.Millisecond), context.DeadlineExceeded)
	require.ErrorIs(t, shutdownWithin(20*time.Millisecond), context.DeadlineExceeded, "the second Shutdown still waits for the sampler")

	// One Shutdown waits without a deadline, as the collector's does.
	waiting := make(chan error, 1)
	go func() { waiting <- r.Shutdown(context.Background()) }()
	other := make(chan error, 1)
	go func() { other <- shutdownWithin(20 * time.Millisecond) }()
	select {
	case err := <-other:
		require.ErrorIs(t, err, context.DeadlineExceeded)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "a Shutdown was held past its ctx by another one waiting")
	}
	select {
	case err := <-waiting:
		require.FailNow(t, "Shutdown returned while the sampler was stuck", "err: %v", err)
	default:
	}

	release()
	select {
	case err := <-waiting:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		require.FailNow(t, "Shutdown never completed after the read returned")
	}
	assert.True(t, src.closed.Load())
	require.NoError(t, r.Shutdown(context.Background()))
}
