// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/statuspage"
)

// decisionCounts are cumulative in-memory counts of decisions per protocol,
// signal and verdict. They are the only counting the request path does (one
// atomic add, no allocation): the throttle_requests counter is observed from
// them, and the status page reads them. Each (protocol, signal) row has its
// own cache line so that receivers of different signals do not contend.
type decisionCounts struct {
	rows [middleware.NumProtocols][decision.NumSignals]struct {
		n [decision.NumVerdicts]atomic.Uint64
		_ [64 - decision.NumVerdicts*8%64]byte
	}
}

// add counts one decision. Callers check the bounds of p, s and v.
func (c *decisionCounts) add(p middleware.Protocol, s decision.Signal, v decision.Verdict) {
	c.rows[p][s].n[v].Add(1)
}

// loadProtocol returns the count of (p, s, v).
func (c *decisionCounts) loadProtocol(p middleware.Protocol, s decision.Signal, v decision.Verdict) uint64 {
	return c.rows[p][s].n[v].Load()
}

// load returns the count of (s, v) over every protocol.
func (c *decisionCounts) load(s decision.Signal, v decision.Verdict) uint64 {
	var n uint64
	for p := range middleware.NumProtocols {
		n += c.rows[p][s].n[v].Load()
	}
	return n
}

// extensionStatus is the extension's outward view of itself: the optional
// status page (its ring of samples and HTTP server) and, with report_status,
// the component status reported to the host.
type extensionStatus struct {
	e      *throttleExtension
	set    component.TelemetrySettings
	info   statuspage.Info // Source is filled in by start
	report bool

	// stale says whether the published water level is too old to act on
	// (newExtension sets the engine's; always false by default). It is
	// called from the status handler, so it must not take e.mu (Shutdown
	// holds it while it waits for the handler).
	stale func() bool

	// ring is nil when the status page is off.
	ring *statuspage.Ring

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

	// Start and Shutdown only (both under e.mu).
	server  *http.Server
	ln      net.Listener
	serveWG sync.WaitGroup
}

func newExtensionStatus(e *throttleExtension, set component.TelemetrySettings) *extensionStatus {
	cfg := e.cfg
	st := &extensionStatus{
		e:      e,
		set:    set,
		report: cfg.ReportStatus,
		stale:  func() bool { return false },
		info: statuspage.Info{
			SampleInterval: cfg.SampleInterval,
			CPU:            thresholdInfo(cfg.Thresholds.CPU),
			Mem:            thresholdInfo(cfg.Thresholds.Mem),
		},
	}
	for s := range decision.NumSignals {
		r := cfg.RuleFor(s)
		st.info.Signals[s] = statuspage.SignalInfo{Enabled: !e.exempt[s], DropMin: r.DropMin, DropMax: r.DropMax}
	}
	if cfg.Status.HasValue() {
		st.ring = statuspage.NewRingFor(cfg.SampleInterval)
	}
	return st
}

func thresholdInfo(s SlotConfig) statuspage.Threshold {
	return statuspage.Threshold{Enabled: s.Enabled, Enter: s.Enter, Exit: s.Exit, Hard: s.Hard, BreachN: s.BreachN}
}

// start keeps the host for status reports and, when the status section is
// configured, starts the status server. It runs in Start before the sampler
// starts, so the first sample already finds the host. On error nothing is
// left running.
func (st *extensionStatus) start(ctx context.Context, host component.Host, src ResourceSource) error {
	if st == nil {
		return nil
	}
	st.host = host
	st.info.Source = src.Describe()
	if !st.e.cfg.Status.HasValue() {
		return nil
	}
	scfg := *st.e.cfg.Status.Get() // ToServer fills in defaults; keep the config as loaded
	var exts map[component.ID]component.Component
	if host != nil {
		exts = host.GetExtensions()
	}
	h := statuspage.Handler(st.ring, st.statusInfo, st.live, scfg.NetAddr.Endpoint)
	srv, err := scfg.ToServer(ctx, exts, st.set, h)
	if err != nil {
		return err
	}
	ln, err := scfg.ToListener(ctx)
	if err != nil {
		return err
	}
	st.server, st.ln = srv, ln
	st.set.Logger.Info("throttle status page listening", zap.String("endpoint", ln.Addr().String()))
	st.serveWG.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			// The page is a diagnostic aid: losing it must not stop the
			// collector, so this is logged rather than reported as fatal.
			st.set.Logger.Error("throttle status page stopped serving", zap.Error(err))
		}
	})
	return nil
}

// addr is the status server's bound address, or nil when it is not running.
func (st *extensionStatus) addr() net.Addr {
	if st == nil || st.ln == nil {
		return nil
	}
	return st.ln.Addr()
}

// shutdown stops reporting and closes the status server, waiting for its
// goroutine. It runs first in Shutdown, before the sampler stops.
func (st *extensionStatus) shutdown(ctx context.Context) error {
	if st == nil {
		return nil
	}
	// Under reportMu: no report is in progress once Shutdown goes on.
	st.reportMu.Lock()
	st.closing = true
	st.reportMu.Unlock()
	if st.server == nil {
		return nil
	}
	err := st.server.Shutdown(ctx)
	if err != nil {
		// ctx expired with requests in flight: cut them off rather than
		// leave the goroutine behind.
		err = errors.Join(err, st.server.Close())
	}
	st.serveWG.Wait()
	st.server, st.ln = nil, nil
	return err
}

// record runs on the sampler goroutine after engine.Observe: it appends the
// sample to the ring and reports a change of the set of Open signals to the
// host. It does not allocate unless that set changed.
func (st *extensionStatus) record(wl *sampler.WaterLevel) {
	if st == nil || wl == nil {
		return
	}
	if st.ring != nil {
		s := statuspage.Sample{
			At: wl.At, CPU: wl.CPU, CPUFast: wl.CPUFast, CPUSlow: wl.CPUSlow, CPUValid: wl.CPUValid,
			Mem: wl.Mem, MemValid: wl.MemValid,
		}
		for sig := range decision.NumSignals {
			s.States[sig] = st.e.State(sig)
		}
		s.Allowed, s.Denied = st.totals()
		st.ring.Record(s)
	}
	st.reportChange()
}

// totals sums the decision counts over every signal.
func (st *extensionStatus) totals() (allowed, denied uint64) {
	c := &st.e.tel.counts
	for s := range decision.NumSignals {
		allowed += c.load(s, decision.Admit)
		for v := decision.DenyShed; v <= decision.DenyBudget; v++ {
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
func (st *extensionStatus) reportChange() {
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
		if !st.e.exempt[s] && st.e.State(s) == decision.Open {
			open |= 1 << s
		}
	}
	stalled := open != 0 && st.e.open.stalled()
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
func (st *extensionStatus) statusInfo() statuspage.Info { return st.info }

// live is the status page's LiveStatus provider, called on every GET
// /status. It reads atomics only: Shutdown holds e.mu while it waits for
// in-flight requests, so taking e.mu here could deadlock it.
func (st *extensionStatus) live() statuspage.LiveStatus {
	e := st.e
	stat := e.engine.Stat()
	wl := &stat.Level
	stale := st.stale()
	l := statuspage.LiveStatus{
		At: wl.At, CPU: wl.CPU, CPUFast: wl.CPUFast, CPUSlow: wl.CPUSlow, CPUValid: wl.CPUValid,
		Mem: wl.Mem, MemValid: wl.MemValid, WorkingSet: wl.WorkingSet, MemLimit: wl.MemLimit, Cores: wl.Cores,
		Stale: stale,
	}
	c := &e.tel.counts
	for s := range decision.NumSignals {
		sig := &l.Signals[s]
		sig.State = e.State(s)
		// Exempt signals are always admitted, and a stale level admits
		// everything: nothing is dropped whatever the machine says.
		if !e.exempt[s] && !stale {
			sig.DropProbability = stat.Signals[s].DropProbability
		}
		sig.Allowed = c.load(s, decision.Admit)
		sig.DeniedShed = c.load(s, decision.DenyShed)
		sig.DeniedOpen = c.load(s, decision.DenyOpen)
		sig.DeniedBudget = c.load(s, decision.DenyBudget)
	}
	l.BudgetReserved, l.BudgetLimit = e.budgetValues()
	return l
}
