// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// The engine reports one change per signal; the page lists one entry per
// change of the shared state machine, naming the signals it concerns.
func TestTransitionsJoinOneFrame(t *testing.T) {
	var l Transitions
	at := t0
	for s := range decision.NumSignals {
		l.Add(at, s, decision.StateNormal, decision.StateShedding, "cpu slow 91% > enter 90%")
	}
	// The same frame with another reason, and a later frame: new entries.
	l.Add(at, decision.SignalTraces, decision.StateNormal, decision.StateShedding, "memory 86% > enter 85%")
	l.Add(at.Add(time.Second), decision.SignalLogs, decision.StateShedding, decision.StateOpen, "memory 93% ≥ hard 92%")
	l.Add(at.Add(time.Second), decision.NumSignals, decision.StateShedding, decision.StateOpen, "ignored") // out of range

	got := l.Newest()
	require.Len(t, got, 3)
	assert.Equal(t, Transition{
		At: at.Add(time.Second), Signals: [decision.NumSignals]bool{decision.SignalLogs: true},
		From: decision.StateShedding, To: decision.StateOpen, Why: "memory 93% ≥ hard 92%",
	}, got[0])
	assert.Equal(t, [decision.NumSignals]bool{decision.SignalTraces: true}, got[1].Signals)
	assert.Equal(t, "memory 86% > enter 85%", got[1].Why)
	assert.Equal(t, [decision.NumSignals]bool{true, true, true, true}, got[2].Signals)
	assert.Equal(t, "cpu slow 91% > enter 90%", got[2].Why)

	// Newest returns a copy.
	got[0].Why = "changed"
	assert.Equal(t, "memory 93% ≥ hard 92%", l.Newest()[0].Why)
}

// Only the newest MaxTransitions changes are kept, newest first.
func TestTransitionsBounded(t *testing.T) {
	var l Transitions
	assert.Empty(t, l.Newest())
	for i := range MaxTransitions + 5 {
		from, to := decision.StateNormal, decision.StateShedding
		if i%2 == 1 {
			from, to = to, from
		}
		l.Add(t0.Add(time.Duration(i)*time.Second), decision.SignalTraces, from, to, "")
	}
	got := l.Newest()
	require.Len(t, got, MaxTransitions)
	for i, e := range got {
		assert.Equal(t, t0.Add(time.Duration(MaxTransitions+4-i)*time.Second), e.At, i)
	}

	var none *Transitions
	assert.Nil(t, none.Newest())
}
