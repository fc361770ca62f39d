// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"errors"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	f := func(edit func(*Config), want ...error) {
		t.Helper()
		cfg := NewDefaultConfig()
		edit(&cfg)
		err := errors.Join(cfg.Validate(), cfg.Fairness.Validate())
		if len(want) == 0 {
			require.NoError(t, err)
			return
		}
		for _, w := range want {
			require.ErrorIs(t, err, w)
		}
	}
	f(func(*Config) {})
	f(func(c *Config) { c.MaxInflightBytes = FixedInflightBudget(0); c.UnknownSize = 0 })
	f(func(c *Config) { c.UnknownSize = 0 }, ErrUnknownSizeZero)
	f(func(c *Config) { c.MaxInflightBytes = FixedInflightBudget(MiB); c.UnknownSize = 2 * MiB }, ErrUnknownSizeOverBudget)
	f(func(c *Config) { c.IdleTimeout = 0 })
	f(func(c *Config) { c.IdleTimeout = 500 * time.Millisecond }, ErrIdleTimeout)
	f(func(c *Config) { c.IdleTimeout = 2 * time.Minute }, ErrIdleTimeout)
	f(func(c *Config) { c.WaitTimeout = 11 * time.Second }, ErrWaitTimeout)
	f(func(c *Config) { c.WaitTimeout = -time.Second }, ErrWaitTimeout)
	f(func(c *Config) { c.GRPCMaxMessageSize = 32 * KiB }, ErrGRPCMaxMessageSize)
	f(func(c *Config) { c.MaxInflightBytes = FixedInflightBudget(2 * TiB) }, ErrSizeTooLarge)
	f(func(c *Config) { c.Fairness.Share = 0 }, ErrShare)
	f(func(c *Config) { c.Fairness.Share = 1.5 }, ErrShare)
	f(func(c *Config) { c.Fairness.Share = math.NaN() }, ErrShare)
	f(func(c *Config) { c.Fairness.Key = "tenant" }, ErrKey)
	f(func(c *Config) { c.Fairness.Key = KeyHeader }, ErrHeaderMissing)
	f(func(c *Config) { c.Fairness.Key, c.Fairness.Header = KeyHeader, "X Tenant" }, ErrHeaderInvalid)
	f(func(c *Config) { c.Fairness.Key, c.Fairness.Header = KeyHeader, "X-Scope-OrgID" })
	f(func(c *Config) { c.Fairness.Header = "X-Tenant" }, ErrHeaderUnused)
	f(func(c *Config) { c.Fairness.Key = KeyAuth }, ErrAuthMissing)
	f(func(c *Config) { c.Fairness.AuthAttribute = "subject" }, ErrAuthUnused)
	f(func(c *Config) { c.Fairness.TrustedProxies = []string{"10.0.0.0/8", "::1", "192.0.2.7"} })
	f(func(c *Config) { c.Fairness.TrustedProxies = []string{"proxy.local"} }, ErrTrustedProxy)
	f(func(c *Config) { c.Fairness.ForwardedHeader = "forwarded" })
	f(func(c *Config) { c.Fairness.ForwardedHeader = "X-Real-IP" }, ErrForwarded)
	f(func(c *Config) { c.Fairness.Weights = map[string]float64{"10.1.0.0/16": 4, "192.0.2.1": 2} })
	f(func(c *Config) { c.Fairness.Weights = map[string]float64{"tenant-a": 4} }, ErrWeightKey)
	f(func(c *Config) { c.Fairness.Weights = map[string]float64{"10.0.0.0/8": 0} }, ErrWeight)
	f(func(c *Config) { c.Fairness.Weights = map[string]float64{"10.0.0.0/8": 1001} }, ErrWeight)
	f(func(c *Config) {
		c.Fairness.Key, c.Fairness.Header = KeyHeader, "X-Tenant"
		c.Fairness.Weights = map[string]float64{"tenant-a": 4, " ": 1}
	}, ErrWeightKeyEmpty)
}

func TestHoldConfigValidate(t *testing.T) {
	f := func(c HoldConfig, want error) {
		t.Helper()
		if want == nil {
			require.NoError(t, c.Validate())
			return
		}
		require.ErrorIs(t, c.Validate(), want)
	}
	f(NewDefaultHoldConfig(), nil)
	f(HoldConfig{}, nil)
	f(HoldConfig{MaxWait: time.Minute, MaxRequests: 1}, ErrHoldMaxWait)
	f(HoldConfig{MaxWait: time.Second, MaxRequests: -1}, ErrHoldMaxRequests)
	f(HoldConfig{MaxWait: time.Second, MaxRequests: 5000}, ErrHoldMaxRequests)
}

func TestParsePrefix(t *testing.T) {
	f := func(in, want string) {
		t.Helper()
		p, err := parsePrefix(in)
		if want == "" {
			require.Error(t, err, in)
			return
		}
		require.NoError(t, err, in)
		assert.Equal(t, netip.MustParsePrefix(want), p, in)
	}
	f("10.1.2.3", "10.1.2.3/32")
	f(" 10.1.2.3/8 ", "10.0.0.0/8")
	f("::ffff:10.1.2.3", "10.1.2.3/32")
	f("::ffff:10.0.0.0/104", "10.0.0.0/8")
	f("2001:db8::1/64", "2001:db8::/64")
	f("::ffff:0.0.0.0/90", "")
	f("10.1.2", "")
	f("", "")
}
