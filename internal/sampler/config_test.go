// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package sampler

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCheckInterval(t *testing.T) {
	for _, d := range []time.Duration{10 * time.Millisecond, DefaultInterval, 10 * time.Second} {
		require.NoError(t, CheckInterval(d), "%v", d)
	}
	for _, d := range []time.Duration{0, 5 * time.Millisecond, 11 * time.Second} {
		err := CheckInterval(d)
		require.ErrorIs(t, err, errInterval, "%v", d)
		assert.Contains(t, err.Error(), "check_interval must be between 10ms and 10s, got "+d.String())
	}
}

func TestCPUConfigCheck(t *testing.T) {
	require.NoError(t, DefaultCPUConfig().Check())
	err := CPUConfig{SlowWindow: 2 * time.Minute, FastWindow: 0, FallbackCores: math.Inf(1)}.Check()
	require.ErrorIs(t, err, errCPUWindow)
	require.ErrorIs(t, err, errFallbackCores)
	require.EqualError(t, err, "slow_window must be > 0 and <= 1m0s, got 2m0s\n"+
		"fast_window must be > 0 and <= 1m0s, got 0s\n"+
		"fallback_cores must be a number >= 0, got +Inf")
	require.ErrorIs(t, CPUConfig{SlowWindow: time.Second, FastWindow: time.Second, FallbackCores: math.NaN()}.Check(), errFallbackCores)
}

func TestMemoryConfigCheck(t *testing.T) {
	for _, mib := range []uint64{0, 32, 1 << 20} {
		require.NoError(t, MemoryConfig{LimitMiB: mib}.Check(), mib)
	}
	err := MemoryConfig{LimitMiB: 31}.Check()
	require.ErrorIs(t, err, errLimitTooSmall)
	require.EqualError(t, err, "limit_mib must be 0 (the cgroup's limit) or >= 32: a collector's own baseline fills a smaller limit past the hard line, a permanent Open, got 31")
	err = MemoryConfig{LimitMiB: 1 << 44}.Check()
	require.ErrorIs(t, err, errLimitTooLarge)
	assert.EqualError(t, err, "limit_mib must be <= 17592186044415, got 17592186044416")
}
