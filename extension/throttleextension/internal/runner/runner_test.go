// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"context"
	"math"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/softlimit"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// hangingSource stands in for this process's cgroup: a memory limit far
// above anything the test allocates, so the soft limit it leads to never
// binds, and a CPU time read that hangs, as one stuck in the kernel would,
// once BlockCPUTime has been called. It records Close.
type hangingSource struct {
	*testutil.Source
	closed atomic.Bool
	// closedReading: Close ran while a read was in progress.
	closedReading atomic.Bool
}

func newHangingSource() *hangingSource {
	src := testutil.NewSource(cgroup.Limits{QuotaCores: 1, MemLimit: 1 << 40})
	src.SetWorkingSet(64 << 20)
	src.SetCPUTime(time.Second)
	return &hangingSource{Source: src}
}

func (h *hangingSource) Close() error {
	h.closedReading.Store(h.ReadingCPUTime())
	h.closed.Store(true)
	return nil
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
		c.CheckInterval = 10 * time.Millisecond
		c.Memory.SoftLimit = softlimit.DefaultConfig()
	})
	r, err := New(cfg, componenttest.NewNopTelemetrySettings(), component.MustNewID("throttle"), Options{ProcessSource: src})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, r.Shutdown(context.Background())) })
	require.NoError(t, r.Start(context.Background(), componenttest.NewNopHost()))
	// The first sample, taken inside Start, set both.
	memLimit, _ := src.Limits()
	require.Equal(t, int64(float64(memLimit.MemLimit)*softlimit.DefaultConfig().Share), debug.SetMemoryLimit(-1), "the soft limit follows the source's memory limit")
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
	release := src.BlockCPUTime(t)

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
	release := src.BlockCPUTime(t)

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
