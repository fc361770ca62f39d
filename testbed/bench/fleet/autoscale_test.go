// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestNeededReplicas(t *testing.T) {
	f := func(caps []float64, offered float64, want int) {
		t.Helper()
		assert.Equal(t, want, neededReplicas(caps, offered), "%v for %g", caps, offered)
	}
	f([]float64{100, 100, 100}, 250, 3)
	f([]float64{100, 100, 100}, 200, 2)
	f([]float64{100, 100, 100}, 201, 3)
	f([]float64{100, 100, 100}, 50, 1)
	f([]float64{100, 100}, 500, 2) // never enough: all of them
}
