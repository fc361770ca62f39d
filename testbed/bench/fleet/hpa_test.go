// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	yaml "go.yaml.in/yaml/v3"
)

func counted(v float64) podSample { return podSample{value: v, state: podCounted} }
func aside(v float64) podSample   { return podSample{value: v, state: podSetAside} }

var missing = podSample{state: podMissing}

// TestDesiredReplicas: the replica calculator's answer, as Kubernetes
// documents it: ceil(current × average / target) over the pods with a
// metric, nothing within the tolerance, and pods without a metric or set
// aside (on CPU: not ready, or ready for less than a metric window)
// counted as 0 on a scale-up.
func TestDesiredReplicas(t *testing.T) {
	f := func(pods []podSample, current int, target float64, want int) {
		t.Helper()
		assert.Equal(t, want, desiredReplicas(pods, current, target, hpaTolerance), "%v, %d replicas, target %g", pods, current, target)
	}
	// CPU at the throttle's enter line against a 0.7 target: one more.
	f([]podSample{counted(0.9)}, 1, 0.7, 2)
	// Demand of 2.2 (refusing more than half) against 0.8: 2.75 → 3 at once.
	f([]podSample{counted(2.2)}, 1, 0.8, 3)
	f([]podSample{counted(0.9), counted(1.1)}, 2, 0.7, 3)
	// Within the tolerance (|ratio - 1| ≤ 0.1): the count stays.
	f([]podSample{counted(0.76)}, 1, 0.7, 1)
	f([]podSample{counted(0.64)}, 1, 0.7, 1)
	f([]podSample{counted(0.78)}, 1, 0.7, 2)
	f([]podSample{counted(0.85), counted(0.85), counted(0.85)}, 3, 0.8, 3)
	// A scale-down by the calculator (normalize keeps the count).
	f([]podSample{counted(0.2), counted(0.2)}, 2, 0.7, 1)
	// A pod with no metric yet counts as 0 on a scale-up: 1.6 and 0
	// average 0.8, at the target.
	f([]podSample{counted(1.6), missing}, 2, 0.8, 2)
	f([]podSample{counted(2.4), missing}, 2, 0.8, 3)
	// A CPU pod set aside (ready less than a window ago) counts as 0 on a
	// scale-up; when that turns the ratio below 1, nothing happens.
	f([]podSample{counted(0.95), aside(0.5)}, 2, 0.7, 2)
	f([]podSample{counted(1), aside(0.5)}, 2, 0.4, 3)
	// ...and is left out of a scale-down.
	f([]podSample{counted(0.2), aside(0.9)}, 2, 0.7, 1)
	// No metric at all: the HPA leaves the scale alone.
	f([]podSample{missing, aside(0.9)}, 2, 0.7, 2)
}

// TestNormalize: the scale the HPA sets from the calculator's count: the
// default policy (per 15 s, double or add 4, whichever is more), the
// maximum, the scale-up stabilisation window, and no scale-down.
func TestNormalize(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	type step struct {
		at               time.Duration
		current, desired int
		want             int
	}
	f := func(b hpaBehavior, steps ...step) {
		t.Helper()
		h := &hpaState{behavior: b}
		for _, s := range steps {
			assert.Equal(t, s.want, h.normalize(t0.Add(s.at), s.current, s.desired), "at %s: %d → %d", s.at, s.current, s.desired)
		}
	}
	// The maximum.
	f(defaultScaleUp(1, 3), step{0, 1, 5, 3})
	// The policies: from 1, Pods (1 + 4) beats Percent (2); from 10,
	// Percent (20) beats Pods (14).
	f(defaultScaleUp(1, 50), step{0, 1, 10, 5})
	f(defaultScaleUp(1, 50), step{0, 10, 30, 20})
	// What was added within the last 15 s counts against the period: at
	// 10 s the period started at 1 replica; at 16 s a new one starts at 5.
	f(defaultScaleUp(1, 50), step{0, 1, 20, 5}, step{10 * time.Second, 5, 20, 5}, step{16 * time.Second, 5, 20, 10})
	// No scale-down, and the minimum.
	f(defaultScaleUp(1, 10), step{0, 3, 1, 3})
	f(defaultScaleUp(2, 10), step{0, 1, 1, 2})
	// A 30 s stabilisation window follows the smallest recommendation
	// within it: 2 until the 3 of 15 s is the oldest left.
	stable := defaultScaleUp(1, 10)
	stable.upWindow = 30 * time.Second
	f(stable, step{0, 1, 2, 2}, step{15 * time.Second, 2, 3, 2}, step{30 * time.Second, 2, 3, 3})
	// Without stabilisation (the default), the newest recommendation.
	f(defaultScaleUp(1, 10), step{0, 1, 2, 2}, step{15 * time.Second, 2, 3, 3})
}

// TestReplayTargetsAreTheManifests: the replay scales on the targets the
// example HPAs in examples/kubernetes set.
func TestReplayTargetsAreTheManifests(t *testing.T) {
	read := func(name string) map[string]any {
		b, err := os.ReadFile(filepath.Join("..", "..", "..", "examples", "kubernetes", name))
		require.NoError(t, err)
		var doc map[string]any
		require.NoError(t, yaml.Unmarshal(b, &doc), name)
		metrics, _ := doc["spec"].(map[string]any)["metrics"].([]any)
		require.Len(t, metrics, 1, name)
		return metrics[0].(map[string]any)
	}
	cpu := read("hpa-cpu.yaml")["resource"].(map[string]any)["target"].(map[string]any)["averageUtilization"].(int)
	assert.InDelta(t, float64(cpu)/100, autoscaleSignals[signalCPU].target, 1e-9, "hpa-cpu.yaml's averageUtilization")
	v := read("hpa-demand.yaml")["pods"].(map[string]any)["target"].(map[string]any)["averageValue"].(string)
	scale := 1.0
	if m, ok := strings.CutSuffix(v, "m"); ok {
		v, scale = m, 1e-3
	}
	demand, err := strconv.ParseFloat(v, 64)
	require.NoError(t, err)
	assert.InDelta(t, demand*scale, autoscaleSignals[signalDemand].target, 1e-9, "hpa-demand.yaml's averageValue")
}
