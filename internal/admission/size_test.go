// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseByteSize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in        string
		want      ByteSize
		wantError string
	}{
		{"0", 0, ""},
		{"1048576", MiB, ""},
		{"1B", 1, ""},
		{"24MiB", 24 * MiB, ""},
		{"24 MiB", 24 * MiB, ""},
		{" 24mib ", 24 * MiB, ""},
		{"256Mi", 256 * MiB, ""},
		{"64MB", 64_000_000, ""},
		{"64M", 64_000_000, ""},
		{"1kB", 1000, ""},
		{"1KiB", KiB, ""},
		{"1GiB", GiB, ""},
		{"1.5GiB", GiB + GiB/2, ""},
		{"2TiB", 2 * TiB, ""},
		{"1TB", 1_000_000_000_000, ""},
		{"18446744073709551615", math.MaxUint64, ""},
		{"", 0, `invalid size "": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"MiB", 0, `invalid size "MiB": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"-1MiB", 0, `invalid size "-1MiB": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"1XB", 0, `invalid size "1XB": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"1.2.3MiB", 0, `invalid size "1.2.3MiB": want a number of bytes or a size like 24MiB, 64MB or 1GiB`},
		{"0.3KiB", 0, `invalid size "0.3KiB": not a whole number of bytes`},
		{"18446744073709551616", 0, `invalid size "18446744073709551616": too large`},
		{"16777216TiB", 0, `invalid size "16777216TiB": too large`},
		{"16777216.0TiB", 0, `invalid size "16777216.0TiB": too large`},
	} {
		got, err := ParseByteSize(tc.in)
		if tc.wantError != "" {
			require.EqualError(t, err, tc.wantError, tc.in)
			continue
		}
		require.NoError(t, err, tc.in)
		assert.Equal(t, tc.want, got, tc.in)
	}
}

func TestByteSizeRoundTrip(t *testing.T) {
	t.Parallel()
	for _, n := range []ByteSize{0, 1, 1000, 1023, KiB, 1536, MiB, 24 * MiB, 64_000_000, GiB, 3 * TiB, math.MaxUint64} {
		text, err := n.MarshalText()
		require.NoError(t, err)
		var back ByteSize
		require.NoError(t, back.UnmarshalText(text), string(text))
		assert.Equal(t, n, back, string(text))
	}
	assert.Equal(t, "24MiB", (24 * MiB).String())
	assert.Equal(t, "1536KiB", ByteSize(1536*1024).String())
	assert.Equal(t, "1000B", ByteSize(1000).String())

	for _, b := range []InflightBudget{AutoInflightBudget(), FixedInflightBudget(0), FixedInflightBudget(24 * MiB), FixedInflightBudget(12345)} {
		text, err := b.MarshalText()
		require.NoError(t, err)
		var back InflightBudget
		require.NoError(t, back.UnmarshalText(text), string(text))
		assert.Equal(t, b, back, string(text))
	}
}

func TestConfigResolveBudget(t *testing.T) {
	t.Parallel()
	auto := AutoInflightBudget()
	for _, tc := range []struct {
		name     string
		budget   InflightBudget
		memLimit uint64
		cores    float64
		want     uint64
	}{
		{"auto, 1 core, 300MiB: by CPU", auto, 300 << 20, 1, 10 << 20},
		{"auto, 0.3 core, 150MiB: by CPU", auto, 150 << 20, 0.3, 3145728},
		{"auto, 4 cores, 300MiB: by memory", auto, 300 << 20, 4, 25 << 20},
		{"auto, 16 cores, 1GiB: by memory", auto, 1 << 30, 16, (1 << 30) / 12},
		{"auto clamps low", auto, 6 << 20, 2, 1 << 20},
		{"auto clamps low by CPU", auto, 1 << 30, 0.05, 1 << 20},
		{"auto clamps high", auto, 64 << 30, 64, 256 << 20},
		{"auto, cores unknown: by memory", auto, 300 << 20, 0, 25 << 20},
		{"auto without a limit: 32MiB at most", auto, 0, 16, 32 << 20},
		{"auto without a limit, 1 core", auto, 0, 1, 10 << 20},
		{"off", FixedInflightBudget(0), 300 << 20, 1, 0},
		{"off without a limit", FixedInflightBudget(0), 0, 1, 0},
		{"fixed ignores the limit", FixedInflightBudget(24 * MiB), 1 << 30, 1, 24 << 20},
		{"fixed without a limit", FixedInflightBudget(24 * MiB), 0, 0, 24 << 20},
	} {
		assert.Equal(t, tc.want, tc.budget.Resolve(tc.memLimit, tc.cores), tc.name)
	}
	// The held pool is the memory part alone: a held stream does no work.
	assert.EqualValues(t, 25<<20, HeldPool(300<<20), "300MiB, whatever the cores")
	assert.EqualValues(t, 32<<20, HeldPool(0), "no limit")
	assert.True(t, FixedInflightBudget(0).IsOff())
	assert.True(t, InflightBudget{}.IsOff(), "the zero value is off")
	assert.False(t, auto.IsOff())
	assert.Equal(t, ByteSize(0), auto.Fixed())
}
