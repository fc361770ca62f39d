// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestCapacitySearch(t *testing.T) {
	// f runs the search over (offered, delivered) steps and checks the
	// number of steps it takes and the capacity it finds.
	f := func(steps [][2]float64, wantSteps int, wantBest, wantOffered float64) {
		t.Helper()
		var c CapacitySearch
		n := 0
		for _, s := range steps {
			n++
			if c.Step(s[0], s[1]) {
				break
			}
		}
		assert.Equal(t, wantSteps, n)
		assert.InDelta(t, wantBest, c.Best, 0.5)
		assert.InDelta(t, wantOffered, c.BestOffered, 0.5, "the rate to measure again is the best step's")
	}
	var c CapacitySearch
	for _, s := range [][2]float64{{4000, 3824}, {5000, 4691}, {6250, 6230}, {7812, 9388}, {9766, 11272}, {12207, 1370}, {15259, 16403}} {
		c.Step(s[0], s[1])
	}
	assert.InDelta(t, 9766, c.KeptUp, 0.5, "the highest rate the sink received before it first fell behind")
	c = CapacitySearch{}
	c.Step(4000, 3700)
	assert.Zero(t, c.KeptUp, "behind from the start: none kept up with")
	// Keeping up: never done.
	f([][2]float64{{4000, 4000}, {5000, 5000}, {6250, 6200}}, 3, 6200, 6250)
	// A plateau: two steps behind without a gain end it.
	f([][2]float64{{15259, 14949}, {19073, 15500}, {23842, 15300}, {29802, 15000}}, 3, 15500, 19073)
	// A noisy step behind, then one that still gains: the search goes on
	// to the plateau (the rule of two steps behind stopped at 18,529).
	f([][2]float64{{15259, 14949}, {19073, 15159}, {23842, 18529}, {29802, 23000}, {37252, 23500}, {46566, 22000}, {58207, 21000}}, 6, 23500, 37252)
	// Behind from the start, falling: done after two.
	f([][2]float64{{4000, 1000}, {5000, 900}}, 2, 1000, 4000)
}

// Search offers the steps' rates in turn until the search is done and
// writes each as a row of the table.
func TestCapacityStepsSearch(t *testing.T) {
	var offered []float64
	var out bytes.Buffer
	steps := CapacitySteps{Start: 1000, Growth: 2, MaxSteps: 10, Step: 1}
	require.NoError(t, steps.Check())
	c, err := steps.Search(context.Background(), func(_ context.Context, rate float64, step int) (float64, error) {
		assert.Equal(t, len(offered), step)
		offered = append(offered, rate)
		return min(rate, 3000), nil
	}, &out)
	require.NoError(t, err)
	assert.Equal(t, []float64{1000, 2000, 4000, 8000, 16000}, offered, "two steps behind without a gain end it")
	assert.InDelta(t, 3000, c.Best, 0.5)
	assert.InDelta(t, 4000, c.BestOffered, 0.5)
	assert.Contains(t, out.String(), "| 4000 | 3000 |\n")
	assert.Error(t, CapacitySteps{Start: 1000, Growth: 1, MaxSteps: 10, Step: 1}.Check())
}
