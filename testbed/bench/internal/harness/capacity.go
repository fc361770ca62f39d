// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"
)

// CapacitySearch decides when a capacity measurement has seen the
// gateway's plateau: a step counts as spent when the sink fell behind the
// offered rate (received less than capacityBehind of it) and did not raise
// the best rate by capacityGain; two spent steps in a row end the search. A
// step that falls behind but still raises the best does not count: one
// noisy step would otherwise end the search below the plateau.
type CapacitySearch struct {
	// Best is the best rate the sink received, BestOffered the rate
	// offered in that step.
	Best, BestOffered float64
	// KeptUp is the highest rate offered that the sink received (at least
	// keptUpShare of it) before the first step that fell behind: below the
	// plateau, whatever a backlog delivered in the steps past it.
	KeptUp float64
	spent  int
	behind bool
}

const (
	// capacityBehind is the share of the offered rate below which the sink
	// has fallen behind it.
	capacityBehind = 0.85
	// capacityGain is the gain over the best rate that keeps the search going.
	capacityGain = 1.05
	// keptUpShare is the share of the offered rate the sink receives in a
	// step the gateway kept up with.
	keptUpShare = 0.95
)

// Step records the rate the sink received at an offered rate and reports
// whether the search is over.
func (c *CapacitySearch) Step(offered, got float64) (done bool) {
	raised := got > c.Best*capacityGain
	if got < capacityBehind*offered {
		c.behind = true
	} else if got >= keptUpShare*offered && !c.behind {
		c.KeptUp = max(c.KeptUp, offered)
	}
	if got > c.Best {
		c.Best, c.BestOffered = got, offered
	}
	if got < capacityBehind*offered && !raised {
		c.spent++
	} else {
		c.spent = 0
	}
	return c.spent >= 2
}

// CapacitySteps are the steps of a capacity measurement: an open loop
// from Start, Growth times more each step, each lasting Step, at most
// MaxSteps of them.
type CapacitySteps struct {
	Start, Growth float64
	MaxSteps      int
	Step          time.Duration
}

// Check checks the steps, naming the flags of the benchmarks.
func (s CapacitySteps) Check() error {
	if s.Start <= 0 || s.Growth <= 1 || s.MaxSteps < 1 || s.Step <= 0 {
		return errors.New("-capacity-start, -capacity-step and -capacity-max-steps must be > 0 and -capacity-growth > 1")
	}
	return nil
}

// Search steps the offered rate up until the CapacitySearch is done:
// measure offers rate for one step (the step-th, from 0) and returns the
// rate delivered. Each step is a row of a Markdown table written to out
// (after its header).
func (s CapacitySteps) Search(ctx context.Context, measure func(ctx context.Context, rate float64, step int) (float64, error), out io.Writer) (*CapacitySearch, error) {
	fmt.Fprintf(out, "| offered spans/s | delivered spans/s (second half of the step) |\n|---|---|\n")
	search := &CapacitySearch{}
	rate := s.Start
	for step := 0; step < s.MaxSteps; step++ {
		got, err := measure(ctx, rate, step)
		if err != nil {
			return nil, err
		}
		fmt.Fprintf(out, "| %.0f | %.0f |\n", rate, got)
		if search.Step(rate, got) {
			break
		}
		rate *= s.Growth
	}
	return search, nil
}
