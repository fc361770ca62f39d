// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/confmap"
)

func TestSettingsCheck(t *testing.T) {
	require.NoError(t, DefaultSettings().Check())
	with := func(edit func(*Settings)) Settings { s := DefaultSettings(); edit(&s); return s }
	for name, tc := range map[string]struct {
		s    Settings
		want string
	}{
		"check_interval at its bounds":  {with(func(s *Settings) { s.CheckInterval, s.StaleAfter = 10*time.Second, 20*time.Second }), ""},
		"stale_after 0 at any interval": {with(func(s *Settings) { s.CheckInterval, s.StaleAfter = 10*time.Millisecond, 0 }), ""},
		"stale_after under a second":    {with(func(s *Settings) { s.StaleAfter = 500 * time.Millisecond }), "stale_after must be 0 (never), or at least 1s and at least 2 × check_interval, got 500ms at a check_interval of 250ms"},
		"stale_after under two checks":  {with(func(s *Settings) { s.CheckInterval, s.StaleAfter = 10*time.Second, 15*time.Second }), "got 15s at a check_interval of 10s"},
		"check_interval too short":      {with(func(s *Settings) { s.CheckInterval = 5 * time.Millisecond }), "check_interval must be between 10ms and 10s, got 5ms"},
		"recovery_ramp negative":        {with(func(s *Settings) { s.RecoveryRamp = -time.Second }), "recovery_ramp must be >= 0, got -1s"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.s.Check()
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			assert.ErrorContains(t, err, tc.want)
		})
	}
	require.ErrorIs(t, with(func(s *Settings) { s.StaleAfter = -time.Second }).Check(), errStaleAfter)
}

// TestSectionsValidate: each section checks its lines against its own
// bounds, and what it measures whether its lines are enabled or not.
func TestSectionsValidate(t *testing.T) {
	require.NoError(t, confmap.Validate(DefaultCPUConfig()))
	require.NoError(t, confmap.Validate(DefaultMemoryConfig()))

	cpu := DefaultCPUConfig()
	cpu.Enter, cpu.Exit, cpu.Hard = 1.5, 1, 2
	require.NoError(t, confmap.Validate(cpu), "the CPU lines may go up to 2")
	cpu.Enabled, cpu.FastWindow = false, 0
	require.EqualError(t, confmap.Validate(cpu), "fast_window must be > 0 and <= 1m0s, got 0s")

	mem := DefaultMemoryConfig()
	mem.Hard, mem.LimitMiB = 1.05, 31
	mem.SoftLimit.Share = 2
	assert.EqualError(t, confmap.Validate(mem), "hard must be <= 1, got 1.05\n"+
		"limit_mib must be 0 (the cgroup's limit) or >= 32: a collector's own baseline fills a smaller limit past the hard line, a permanent Open, got 31\n"+
		"soft_limit: share must be in (0, 1], got 2")
}
