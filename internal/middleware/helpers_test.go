// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/otelthrottle/throttle/internal/decision"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// fakeDecider returns settable verdicts and counts its calls.
type fakeDecider struct {
	verdict [decision.NumSignals]atomic.Uint32
	exempt  [decision.NumSignals]atomic.Bool
	pressed atomic.Bool
	decides atomic.Int64
}

func (f *fakeDecider) set(s decision.Signal, v decision.Verdict) { f.verdict[s].Store(uint32(v)) }

func (f *fakeDecider) setAll(v decision.Verdict) {
	for s := range decision.NumSignals {
		f.set(s, v)
	}
}

func (f *fakeDecider) Decide(s decision.Signal) decision.Verdict {
	f.decides.Add(1)
	return decision.Verdict(f.verdict[s].Load())
}

func (f *fakeDecider) Exempt(s decision.Signal) bool { return f.exempt[s].Load() }

// Pressed is true while pressed is set or the verdict set for s is a
// denial.
func (f *fakeDecider) Pressed(s decision.Signal) bool {
	return f.pressed.Load() || stateOf(decision.Verdict(f.verdict[s].Load())) != decision.StateNormal
}

func stateOf(v decision.Verdict) decision.State {
	switch v {
	case decision.VerdictDenyOpen:
		return decision.StateOpen
	case decision.VerdictDenyShed:
		return decision.StateShedding
	}
	return decision.StateNormal
}

// countingRecorder counts Record calls per (protocol, signal, verdict).
type countingRecorder struct {
	n [NumProtocols][decision.NumSignals][decision.NumVerdicts]atomic.Int64
}

func (c *countingRecorder) Record(p Protocol, s decision.Signal, v decision.Verdict) {
	c.n[p][s][v].Add(1)
}

func (c *countingRecorder) get(p Protocol, s decision.Signal, v decision.Verdict) int64 {
	return c.n[p][s][v].Load()
}

func (c *countingRecorder) total() int64 {
	var t int64
	for p := range c.n {
		for s := range c.n[p] {
			for v := range c.n[p][s] {
				t += c.n[p][s][v].Load()
			}
		}
	}
	return t
}

func mustClassifier(tb testing.TB, user Routes) *Classifier {
	tb.Helper()
	c, err := NewClassifier(user)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}
