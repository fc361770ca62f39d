// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/confmap"
	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/statuspage"
)

// decisionCounts are cumulative in-memory counts of decisions per protocol,
// signal and verdict. They are the only counting the request path does (one
// atomic add, no allocation): the throttle_requests counter is observed from
// them, and the status page reads them. Each (protocol, signal) row has its
// own cache line so that receivers of different signals do not contend.
type decisionCounts struct {
	rows [admission.NumProtocols][decision.NumSignals]struct {
		n [decision.NumVerdicts]atomic.Uint64
		_ [64 - decision.NumVerdicts*8%64]byte
	}
	// cuts are the admitted requests cut off, rare enough to share lines.
	cuts [admission.NumProtocols][decision.NumSignals][admission.NumCutReasons]atomic.Uint64
}

// add counts one decision. Callers check the bounds of p, s and v.
func (c *decisionCounts) add(p admission.Protocol, s decision.Signal, v decision.Verdict) {
	c.rows[p][s].n[v].Add(1)
}

// loadProtocol returns the count of (p, s, v).
func (c *decisionCounts) loadProtocol(p admission.Protocol, s decision.Signal, v decision.Verdict) uint64 {
	return c.rows[p][s].n[v].Load()
}

// load returns the count of (s, v) over every protocol.
func (c *decisionCounts) load(s decision.Signal, v decision.Verdict) uint64 {
	var n uint64
	for p := range admission.NumProtocols {
		n += c.rows[p][s].n[v].Load()
	}
	return n
}

// loadCuts returns the cut-offs of s over every protocol and reason.
func (c *decisionCounts) loadCuts(s decision.Signal) uint64 {
	var n uint64
	for p := range admission.NumProtocols {
		for r := range admission.NumCutReasons {
			n += c.cuts[p][s][r].Load()
		}
	}
	return n
}

// status is the extension's outward view of itself: the optional status
// page (its ring of samples and its server) and, with report_status, the
// component status reported to the host.
type status struct {
	r      *Runner
	info   statuspage.Info // Source is filled in by start
	report bool

	// stale says whether the published water level is too old to act on
	// (New sets the engine's; always false by default). It is called from
	// the status handler, so it must not take r.mu (Shutdown holds it
	// while it waits for the handler).
	stale func() bool

	// ring, transitions and server are nil when the status page is off.
	ring        *statuspage.Ring
	transitions *statuspage.Transitions
	server      *statuspage.Server

	// goMemLimit and gcPercent read the Go runtime's soft memory limit
	// (0: none) and GC percent (0: off) in force; goSetBy says who set
	// them, nil until Start has decided.
	goMemLimit, gcPercent func() int64
	goSetBy               atomic.Pointer[goSetBy]

	// Set by start before the sampler starts, so the sampler goroutine
	// reads them without a lock.
	host component.Host

	// reportMu orders the reports: the sampler goroutine reports after each
	// sample, and the stale watchdog may report when its fallback starts or
	// ends (it turns every signal Normal without a sample).
	reportMu sync.Mutex
	// reportedOpen is the set of Open signals last reported, one bit per
	// signal (reportMu).
	reportedOpen uint8
	// reportedStall: the last report said the Open had stalled.
	reportedStall bool
	// closing stops reports once Shutdown has begun (reportMu): the host
	// has moved the component to Stopping, from where StatusOK is not a
	// valid transition.
	closing bool
}

// goSetBy says who set the Go runtime's soft memory limit and GC percent.
type goSetBy struct{ memoryLimit, gcPercent string }

func newStatus(r *Runner, set component.TelemetrySettings) *status {
	cfg := &r.cfg
	src := r.telemetrySources()
	st := &status{
		r:          r,
		report:     cfg.ReportStatus,
		stale:      func() bool { return false },
		goMemLimit: src.goMemLimit,
		gcPercent:  src.gcPercent,
		info: statuspage.Info{
			ObserveOnly:    cfg.ObserveOnly,
			SampleInterval: cfg.CheckInterval,
		},
	}
	for i := range r.resources {
		lines := r.lines.Slots[i]
		lines.Relieve = nil // what the page shows are the lines
		st.info.Resources = append(st.info.Resources, statuspage.Resource{Name: r.resources[i].name, Averaged: r.resources[i].averaged, Lines: lines})
	}
	for s := range decision.NumSignals {
		rule := r.lines.Rules[s]
		st.info.Signals[s] = decision.Rule{Enabled: !r.exempt[s], DropMin: rule.DropMin, DropMax: rule.DropMax}
	}
	if cfg.Status != nil {
		var err error
		if st.info.Config, err = effectiveConfig(cfg.Effective); err != nil {
			// The page is a diagnostic aid: it goes on without this part.
			set.Logger.Warn("throttle status page: the effective configuration cannot be shown", zap.Error(err))
		}
		st.ring = statuspage.NewRingFor(cfg.CheckInterval)
		st.transitions = &statuspage.Transitions{}
		st.server = statuspage.NewServer(*cfg.Status, set, st.ring, st.statusInfo, st.live)
	}
	return st
}

// effectiveConfig is cfg as the status page shows it: marshalled through
// confmap, as the collector prints configurations, so that the keys are
// what users write whatever the Go fields are called, and secrets
// (configopaque) are masked. Durations are written as in YAML ("250ms")
// rather than in nanoseconds; nil gives nil.
func effectiveConfig(cfg any) (map[string]any, error) {
	if cfg == nil {
		return nil, nil
	}
	conf := confmap.New()
	if err := conf.Marshal(cfg); err != nil {
		return nil, err
	}
	m, _ := readableConfig(conf.ToStringMap()).(map[string]any)
	return m, nil
}

// readableConfig returns v with durations as strings and non-finite numbers
// (which JSON cannot hold) as text, in maps and lists at any depth.
func readableConfig(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = readableConfig(e)
		}
	case []any:
		for i, e := range x {
			x[i] = readableConfig(e)
		}
	case time.Duration:
		return x.String()
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return strconv.FormatFloat(x, 'g', -1, 64)
		}
	case float32:
		return readableConfig(float64(x))
	}
	return v
}

// goRuntimeSetBy tells the page who set the soft memory limit and the GC
// percent; Start calls it once it has decided.
func (st *status) goRuntimeSetBy(memoryLimit, gcPercent string) {
	if st == nil {
		return
	}
	st.goSetBy.Store(&goSetBy{memoryLimit: memoryLimit, gcPercent: gcPercent})
}

// transition lists one state change on the page, with what in the frame
// caused it. It runs on the sampler goroutine, from the engine's
// OnTransition.
func (st *status) transition(t decision.Transition) {
	if st == nil || st.transitions == nil {
		return
	}
	st.transitions.Add(t.Level.At, t.Signal, t.From, t.To, transitionReason(t, st.r.resources, st.r.lines.Slots))
}

// start keeps the host for status reports and, when the status section is
// configured, starts the status server. It runs in Start before the sampler
// starts, so the first sample already finds the host. On error nothing is
// left running.
func (st *status) start(ctx context.Context, host component.Host, src sampler.Source) error {
	if st == nil {
		return nil
	}
	st.host = host
	st.info.Source = src.Describe()
	if st.server == nil {
		return nil
	}
	return st.server.Start(ctx, host)
}

// shutdown stops reporting and closes the status server, waiting for its
// goroutine. It runs first in Shutdown, before the sampler stops.
func (st *status) shutdown(ctx context.Context) error {
	if st == nil {
		return nil
	}
	// Under reportMu: no report is in progress once Shutdown goes on.
	st.reportMu.Lock()
	st.closing = true
	st.reportMu.Unlock()
	return st.server.Shutdown(ctx)
}

// record runs on the sampler goroutine after engine.Observe: it appends the
// sample to the ring and reports a change of the set of Open signals to the
// host. It does not allocate unless that set changed.
func (st *status) record(wl *sampler.WaterLevel) {
	if st == nil || wl == nil {
		return
	}
	if st.ring != nil {
		s := statuspage.Sample{At: wl.At, Levels: statuspage.SampleLevels(&wl.Levels), WorkingSet: share(wl.WorkingSet, wl.MemLimit)}
		for sig := range decision.NumSignals {
			s.States[sig] = st.r.State(sig)
		}
		s.Allowed, s.Denied = st.totals()
		st.ring.Record(s)
	}
	st.reportChange()
}

// totals sums the decision counts over every signal.
func (st *status) totals() (allowed, denied uint64) {
	c := &st.r.tel.counts
	for s := range decision.NumSignals {
		allowed += c.load(s, decision.VerdictAdmit)
		for v := decision.VerdictDenyShed; v <= decision.VerdictDenyBudget; v++ {
			denied += c.load(s, v)
		}
	}
	return allowed, denied
}

// reportChange reports a RecoverableError while any throttled signal is
// Open and StatusOK when none is any more, with report_status only. Only
// changes are reported: the host already sets StatusOK after Start, and the
// health check extension keeps the last event. An exempt signal in Open
// rejects nothing, so it does not count. It is safe from any goroutine; the
// sampler goroutine calls it after every sample, and whatever changes the
// states without a sample (the stale fallback) should call it too.
func (st *status) reportChange() {
	if st == nil || !st.report {
		return
	}
	st.reportMu.Lock()
	defer st.reportMu.Unlock()
	if st.closing {
		return
	}
	var open uint8
	for s := range decision.NumSignals {
		if !st.r.exempt[s] && st.r.State(s) == decision.StateOpen {
			open |= 1 << s
		}
	}
	stalled := open != 0 && st.r.open.stalled()
	if open == st.reportedOpen && stalled == st.reportedStall {
		return
	}
	st.reportedOpen, st.reportedStall = open, stalled
	if open == 0 {
		componentstatus.ReportStatus(st.host, componentstatus.NewEvent(componentstatus.StatusOK))
		return
	}
	componentstatus.ReportStatus(st.host, componentstatus.NewRecoverableErrorEvent(openError(open, stalled)))
}

// openError is the error reported while the signals in the open mask are
// Open: "throttle: traces, logs open (collector overloaded); rejecting
// requests", or, once the Open has lasted stallAfter, "throttle: traces,
// logs open for 30s or more: the collector is not draining what it holds;
// rejecting requests".
func openError(open uint8, stalled bool) error {
	var b strings.Builder
	b.WriteString("throttle: ")
	first := true
	for s := range decision.NumSignals {
		if open&(1<<s) == 0 {
			continue
		}
		if !first {
			b.WriteString(", ")
		}
		first = false
		b.WriteString(s.String())
	}
	if stalled {
		fmt.Fprintf(&b, " open for %s or more: the collector is not draining what it holds; rejecting requests", stallAfter)
	} else {
		b.WriteString(" open (collector overloaded); rejecting requests")
	}
	return errors.New(b.String())
}

// statusInfo is the status page's Info provider.
func (st *status) statusInfo() statuspage.Info { return st.info }

// live is the status page's LiveStatus provider, called on every GET
// /status. It reads atomics only: Shutdown holds r.mu while it waits for
// in-flight requests, so taking r.mu here could deadlock it.
func (st *status) live() statuspage.LiveStatus {
	r := st.r
	stat := r.engine.Stat()
	wl := &stat.Level
	stale := st.stale()
	l := statuspage.LiveStatus{
		At: wl.At, Levels: wl.Levels, WorkingSet: wl.WorkingSet, MemLimit: wl.MemLimit, Cores: wl.Cores,
		Stale: stale,
	}
	c := &r.tel.counts
	for s := range decision.NumSignals {
		sig := &l.Signals[s]
		sig.State = r.State(s)
		// A stale level admits everything: nothing is dropped whatever the
		// machine says.
		if !stale {
			sig.DropProbability = stat.Signals[s].DropProbability
		}
		sig.Allowed = c.load(s, decision.VerdictAdmit)
		sig.DeniedShed = c.load(s, decision.VerdictDenyShed)
		sig.DeniedOpen = c.load(s, decision.VerdictDenyOpen)
		sig.DeniedBudget = c.load(s, decision.VerdictDenyBudget)
		sig.CutOff = c.loadCuts(s)
	}
	as := r.adm.Stats()
	l.BudgetReserved, l.BudgetLimit, l.BudgetPeak, l.HeldRequests = as.Reserved, as.Budget, as.Peak, as.HeldRequests
	top, other := r.adm.TopKeys(topKeys)
	for _, k := range append(top, other) {
		l.Keys = append(l.Keys, statuspage.KeyStatus{Name: k.Name, Reserved: k.Reserved, Held: k.Held, Admitted: k.Admitted, Refused: k.Refused})
	}
	l.Go.MemoryLimit, l.Go.GCPercent = st.goMemLimit(), st.gcPercent()
	if by := st.goSetBy.Load(); by != nil {
		l.Go.MemoryLimitSetBy, l.Go.GCPercentSetBy = by.memoryLimit, by.gcPercent
	}
	l.Transitions = st.transitions.Newest()
	return l
}
