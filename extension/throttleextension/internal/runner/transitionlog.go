// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"math"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/otelthrottle/throttle/internal/decision"
)

// State changes must stay visible in the log when the state flaps, and the
// collector samples its log by default (service::telemetry::logs::sampling:
// per 10s tick, the first 10 entries of a message, then 1 in 100; the
// sampler keys on level and message). A sampled core is what the collector
// hands us: it cannot be unwrapped, and a distinct message per line would
// defeat it only by spamming the log. So the extension does its own,
// deterministic sampling below the collector's, and accounts for what it
// leaves out:
//
//   - Each state change is logged on its own line ("throttle traces: normal
//     -> open", one message per signal and pair of states) while fewer than
//     transitionLinesPerWindow changes of that signal have been logged in
//     the current window.
//   - A window lasts transitionLogWindow, as long as the collector's tick,
//     and starts at the first change after the previous one ended. Any tick
//     of the collector's sampler therefore overlaps at most two windows and
//     sees at most 2*5 = 10 entries of one message: all of them pass.
//   - Changes beyond that are counted, and once the window is over a single
//     summary line ("throttle: state changes not logged individually") gives
//     each signal's count and the state it is in now. The summary is written
//     at most once per window (and once more at Shutdown), so it passes too.
//
// The guarantee holds for the collector's default sampling as long as no
// other component logs a message with the same sampler key (fnv32a of the
// message modulo 4096; our own messages are checked to be distinct by a
// test). Everything here runs on the sampler goroutine (or in Shutdown after
// it has stopped); the request path is not involved.
const (
	transitionLogWindow      = 10 * time.Second
	transitionLinesPerWindow = 5
	transitionSummaryMessage = "throttle: state changes not logged individually (more than 5 of a signal in 10s); counts per signal and the state now"
)

// transitionLog writes state-change lines with the bounds described above.
// It is not safe for concurrent use: the sampler goroutine owns it.
type transitionLog struct {
	logger *zap.Logger
	now    func() time.Time
	// resources name the levels of the log lines.
	resources []resource

	windowStart time.Time // zero: no window open
	logged      [decision.NumSignals]int
	unlogged    [decision.NumSignals]int
	// latest is each signal's most recent change not logged individually.
	latest [decision.NumSignals]decision.Transition
}

func newTransitionLog(logger *zap.Logger, now func() time.Time, resources []resource) *transitionLog {
	if now == nil {
		now = time.Now
	}
	return &transitionLog{logger: logger, now: now, resources: resources}
}

// transition logs one state change, or counts it when its signal has used
// up its lines of the window.
func (l *transitionLog) transition(t decision.Transition) {
	if t.Signal >= decision.NumSignals {
		return
	}
	now := l.now()
	if l.windowStart.IsZero() || now.Sub(l.windowStart) >= transitionLogWindow {
		l.summarize()
		l.windowStart = now
	}
	if l.logged[t.Signal] >= transitionLinesPerWindow {
		l.unlogged[t.Signal]++
		l.latest[t.Signal] = t
		return
	}
	l.logged[t.Signal]++
	l.logger.Info("throttle "+t.Signal.String()+": "+t.From.String()+" -> "+t.To.String(),
		append([]zap.Field{
			zap.String("signal", t.Signal.String()),
			zap.String("from", t.From.String()),
			zap.String("to", t.To.String()),
		}, levelFields(l.resources, &t.Level)...)...,
	)
}

// tick writes the summary of the window once it is over. It is called
// after every sample, so the summary is at most one sample interval late.
func (l *transitionLog) tick() {
	if !l.windowStart.IsZero() && l.now().Sub(l.windowStart) >= transitionLogWindow {
		l.summarize()
	}
}

// flush writes the summary of the current window now (Shutdown).
func (l *transitionLog) flush() { l.summarize() }

// summarize writes the summary line if changes went unlogged, and closes the
// window.
func (l *transitionLog) summarize() {
	var fields []zap.Field
	var lvl *decision.Transition
	for s := range decision.NumSignals {
		if l.unlogged[s] == 0 {
			continue
		}
		t := &l.latest[s]
		fields = append(fields, zap.Object(s.String(), unloggedChanges{n: l.unlogged[s], to: t.To}))
		if lvl == nil || t.Level.At.After(lvl.Level.At) {
			lvl = t
		}
	}
	if lvl != nil {
		fields = append(fields, zap.Duration("window", l.now().Sub(l.windowStart)))
		fields = append(fields, levelFields(l.resources, &lvl.Level)...)
		l.logger.Info(transitionSummaryMessage, fields...)
	}
	l.windowStart = time.Time{}
	l.logged = [decision.NumSignals]int{}
	l.unlogged = [decision.NumSignals]int{}
}

// unloggedChanges is one signal's entry of the summary line.
type unloggedChanges struct {
	n  int
	to decision.State
}

func (u unloggedChanges) MarshalLogObject(enc zapcore.ObjectEncoder) error {
	enc.AddInt("changes", u.n)
	enc.AddString("state", u.to.String())
	return nil
}

// transitionReason says what in the frame of t made the change, in the terms
// of the transition table (decision.Engine): the levels of the frame
// against the lines they crossed, resource by resource, each slot holding
// the resource of the same index. Disabled slots are left out; a level
// that is not valid counts as safe, so it is named only where it lets the
// state recover. The streak a line needs (breach_n) is not repeated.
func transitionReason(t decision.Transition, resources []resource, slots []decision.Slot) string {
	var first, second []string
	for i, slot := range slots {
		if !slot.Enabled {
			continue
		}
		l := &t.Level.Levels[i]
		name, slowName, fastName := resources[i].name, resources[i].name, resources[i].name
		if resources[i].averaged {
			slowName, fastName = name+" slow", name+" fast"
		}
		if !l.Valid || math.IsNaN(l.Slow) || math.IsNaN(l.Fast) {
			if recovering := t.To < t.From; recovering { // the states are numbered by severity
				first = append(first, name+" not measured")
			}
			continue
		}
		switch {
		case t.To == decision.StateOpen:
			if l.Fast >= slot.Hard {
				first = append(first, fastName+" "+percent(l.Fast)+" ≥ hard "+percent(slot.Hard))
			}
		case t.From == decision.StateNormal: // to Shedding
			if l.Slow > slot.Enter {
				first = append(first, slowName+" "+percent(l.Slow)+" > enter "+percent(slot.Enter))
			}
		case t.From == decision.StateShedding: // to Normal
			first = append(first, slowName+" "+percent(l.Slow)+" < exit "+percent(slot.Exit))
		default: // from Open, below every hard line; the exit lines pick where to land
			first = append(first, fastName+" "+percent(l.Fast)+" < hard "+percent(slot.Hard))
			if l.Slow > slot.Exit {
				second = append(second, slowName+" "+percent(l.Slow)+" > exit "+percent(slot.Exit))
			} else if t.To == decision.StateNormal {
				second = append(second, slowName+" "+percent(l.Slow)+" < exit "+percent(slot.Exit))
			}
		}
	}
	why := strings.Join(first, ", ")
	if len(second) > 0 {
		why += "; " + strings.Join(second, ", ")
	}
	return why
}

// percent writes a share as a percentage to 0.1.
func percent(v float64) string {
	return strconv.FormatFloat(math.Round(v*1000)/10, 'f', -1, 64) + "%"
}
