// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage // import "github.com/otelthrottle/throttle/internal/statuspage"

import (
	"sync"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// MaxTransitions is how many state changes Transitions keeps: enough to read
// a flapping episode, few enough that every /status carries them all.
const MaxTransitions = 32

// Transition is one state change as the page lists it. The signals share
// one state machine, so a change usually concerns several of them: one
// Transition holds every signal that changed in the same frame the same way.
type Transition struct {
	At       time.Time
	Signals  [decision.NumSignals]bool
	From, To decision.State
	// Why says what in the frame made the change (the levels against the
	// lines), as the extension words it.
	Why string
}

// Transitions keeps the newest MaxTransitions state changes. It is safe for
// concurrent use: the sampler goroutine adds, page requests read.
type Transitions struct {
	mu   sync.Mutex
	buf  [MaxTransitions]Transition
	next int // index the next new entry takes
	n    int // entries held, <= MaxTransitions
}

// Add records that signal s went from one state to another at. A change
// equal to the newest entry but for its signal (the same frame, the same
// states, the same reason) joins that entry.
func (l *Transitions) Add(at time.Time, s decision.Signal, from, to decision.State, why string) {
	if s >= decision.NumSignals {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n > 0 {
		last := &l.buf[(l.next+MaxTransitions-1)%MaxTransitions]
		if last.At.Equal(at) && last.From == from && last.To == to && last.Why == why {
			last.Signals[s] = true
			return
		}
	}
	e := Transition{At: at, From: from, To: to, Why: why}
	e.Signals[s] = true
	l.buf[l.next] = e
	l.next = (l.next + 1) % MaxTransitions
	l.n = min(l.n+1, MaxTransitions)
}

// Newest returns a copy of the entries held, newest first; nil on a nil
// Transitions.
func (l *Transitions) Newest() []Transition {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]Transition, l.n)
	for i := range out {
		out[i] = l.buf[(l.next+MaxTransitions-1-i)%MaxTransitions]
	}
	return out
}
