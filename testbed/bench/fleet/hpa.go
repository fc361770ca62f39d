// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"math"
	"time"
)

// The HorizontalPodAutoscaler's scale-up arithmetic (autoscaling/v2), as
// Kubernetes documents it ("Algorithm details", "Configurable scaling
// behavior") and kube-controller-manager's replica calculator computes it,
// for the autoscaling replay (autoscale.go). Scale-down is left out: the
// replay never removes a replica.

// HPA defaults (kube-controller-manager's flags and the autoscaling/v2
// API's default scale-up behaviour).
const (
	// hpaSyncPeriod: --horizontal-pod-autoscaler-sync-period.
	hpaSyncPeriod = 15 * time.Second
	// hpaTolerance: --horizontal-pod-autoscaler-tolerance.
	hpaTolerance = 0.1
	// hpaCPUWindow is the window of a pod's CPU usage rate as the metrics
	// API serves it (metrics-server's default --metric-resolution): a pod
	// that became ready less than this before the sample is still set
	// aside while it initialises (the CPU initialisation period, 5 min,
	// is longer than any replay).
	hpaCPUWindow = 15 * time.Second
)

// podSample is one pod's metric at a sync, as the replica calculator
// groups it.
type podSample struct {
	value float64
	state podState
}

// podState is how the replica calculator counts a pod.
type podState int

const (
	// podCounted: its metric is in the average (a ready pod; for a Pods
	// metric, any pod that has one).
	podCounted podState = iota
	// podMissing: running but no metric yet.
	podMissing
	// podSetAside: a metric the calculator does not use: on CPU, a pod not
	// ready, or ready for less than one metric window.
	podSetAside
)

// desiredReplicas is the replica calculator's answer for pods at a target
// per pod (calcPlainMetricReplicas; the CPU path, GetResourceReplicas, is
// the same with utilisation for the value): ceil(counted pods × their
// average / target), or current when the ratio is within tolerance of 1.
// On a scale-up, pods with no metric yet and pods set aside count as 0,
// which damps it; when that reverses the direction or brings the ratio
// within tolerance, current.
func desiredReplicas(pods []podSample, current int, target, tolerance float64) int {
	var sum float64
	counted, missing, aside := 0, 0, 0
	for _, p := range pods {
		switch p.state {
		case podCounted:
			sum += p.value
			counted++
		case podMissing:
			missing++
		case podSetAside:
			aside++
		}
	}
	if counted == 0 { // the HPA reports an error and leaves the scale alone
		return current
	}
	ratio := sum / float64(counted) / target
	rebalance := aside > 0 && ratio > 1
	if !rebalance && missing == 0 {
		if math.Abs(1-ratio) <= tolerance {
			return current
		}
		return int(math.Ceil(ratio * float64(counted)))
	}
	n := counted
	if missing > 0 {
		n += missing
		if ratio < 1 { // on a scale-down, a pod with no metric is at the target
			sum += float64(missing) * target
		}
	}
	if rebalance {
		n += aside
	}
	newRatio := sum / float64(n) / target
	if math.Abs(1-newRatio) <= tolerance || (ratio < 1 && newRatio > 1) || (ratio > 1 && newRatio < 1) {
		return current
	}
	desired := int(math.Ceil(newRatio * float64(n)))
	if (newRatio < 1 && desired > current) || (newRatio > 1 && desired < current) {
		return current
	}
	return desired
}

// scalePolicy is one scale-up policy: add at most value pods, or value %
// of the replicas at the start of the period, per period.
type scalePolicy struct {
	percent bool
	value   int
	period  time.Duration
}

// hpaBehavior is the scale-up half of an HPA's spec: its bounds and
// behavior.scaleUp with selectPolicy Max.
type hpaBehavior struct {
	minReplicas, maxReplicas int
	// upWindow is stabilizationWindowSeconds: the smallest recommendation
	// within it is followed.
	upWindow time.Duration
	policies []scalePolicy
}

// defaultScaleUp is the autoscaling/v2 default scale-up behaviour: no
// stabilisation, and per 15 s at most double the replicas or add 4,
// whichever is more.
func defaultScaleUp(minReplicas, maxReplicas int) hpaBehavior {
	return hpaBehavior{
		minReplicas: minReplicas, maxReplicas: maxReplicas,
		policies: []scalePolicy{{percent: true, value: 100, period: 15 * time.Second}, {value: 4, period: 15 * time.Second}},
	}
}

// hpaState is what the HPA remembers between syncs: its recommendations
// and the scale-ups it made.
type hpaState struct {
	behavior        hpaBehavior
	recommendations []timedCount
	scaleUps        []timedCount
}

type timedCount struct {
	at time.Time
	n  int
}

// normalize turns the calculator's desired count at now into the scale
// the HPA sets (normalizeDesiredReplicasWithBehaviors): the smallest
// recommendation within the stabilisation window, at least current (no
// scale-down), at most what the policies allow since the start of their
// periods and maxReplicas; and records the scale-up.
func (h *hpaState) normalize(now time.Time, current, desired int) int {
	b := h.behavior
	desired = max(desired, b.minReplicas)
	up := desired
	for _, r := range h.recommendations {
		if r.at.After(now.Add(-b.upWindow)) {
			up = min(up, r.n)
		}
	}
	h.recommendations = append(h.recommendations, timedCount{now, desired})
	next := max(current, up)
	if next > current {
		next = min(next, max(h.scaleUpLimit(now, current), current), b.maxReplicas)
	}
	if next > current {
		h.scaleUps = append(h.scaleUps, timedCount{now, next - current})
	}
	return next
}

// scaleUpLimit is the most replicas the policies allow at now
// (calculateScaleUpLimitWithScalingRules with selectPolicy Max).
func (h *hpaState) scaleUpLimit(now time.Time, current int) int {
	limit := math.MinInt
	for _, p := range h.behavior.policies {
		added := 0
		for _, e := range h.scaleUps {
			if e.at.After(now.Add(-p.period)) {
				added += e.n
			}
		}
		start := current - added
		proposed := start + p.value
		if p.percent {
			proposed = int(math.Ceil(float64(start) * (1 + float64(p.value)/100)))
		}
		limit = max(limit, proposed)
	}
	return limit
}
