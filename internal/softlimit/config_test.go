// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package softlimit

import (
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	require.NoError(t, DefaultConfig().Validate())
	require.NoError(t, Config{Share: 0.1}.Validate(), "heap_target 0 goes with any share")
	for name, tc := range map[string]struct {
		cfg  Config
		want []error
		text string
	}{
		"share over 1":         {Config{Share: 1.5, HeapTarget: 1}, []error{errShare, errHeapTarget}, "share must be in (0, 1], got 1.5\nheap_target must be in [0, 1), got 1"},
		"share NaN":            {Config{Share: math.NaN()}, []error{errShare}, "share must be in (0, 1], got NaN"},
		"heap_target negative": {Config{Share: 0.8, HeapTarget: -0.1}, []error{errHeapTarget}, "heap_target must be in [0, 1), got -0.1"},
		"heap_target = share":  {Config{Share: 0.5, HeapTarget: 0.5}, []error{errHeapTargetOverShare}, "heap_target must be below share (or 0), got 0.5 and share 0.5"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.Validate()
			for _, w := range tc.want {
				require.ErrorIs(t, err, w)
			}
			assert.EqualError(t, err, tc.text)
		})
	}
}
