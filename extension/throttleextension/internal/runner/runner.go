// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package runner is the machinery of the throttle extension: the sampler, the
// decision engine, the stale watchdog, the log of state changes, the Go soft
// memory limit, the admission budget, the telemetry, the status page and the
// component status. The extension is a shell over one Runner that forwards
// the collector's interfaces to it.
package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/downstream"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/softlimit"
)

// warnEvery bounds how often one kind of sampler failure is logged: the
// sampler ticks 4 times a second and a broken file would flood the log.
const warnEvery = 30 * time.Second

// Options are the runner's test seams. Every field is optional.
type Options struct {
	// Source is where resources are read; nil: the container's cgroup, or
	// the process's own counters where there is none.
	Source sampler.Source
	// ProcessSource stands in for that cgroup or those counters: unlike
	// Source, Start takes it for this process's own, so the heap view
	// corrects its working set, the GC percent follows it, and Shutdown
	// closes it. Ignored when Source is set.
	ProcessSource sampler.Source
	// SetMemoryLimit stands in for the runtime's soft limit setter
	// (debug.SetMemoryLimit); nil: the runtime's, and only with the
	// default source (see Start).
	SetMemoryLimit func(int64) int64
	// LimitsEvery overrides the sampler's limits cadence; 0: its default.
	LimitsEvery time.Duration
}

// Runner owns the throttle's machinery: it runs the sampler, and hands
// decisions to the middleware and the processor.
type Runner struct {
	cfg Config
	// resources are what the throttle holds to lines (resources.go), and
	// lines the engine's configuration, with a slot for each.
	resources []resource
	lines     decision.Config
	logger    *zap.Logger
	source    sampler.Source // injected by tests; nil = cgroup, else process
	// processSource stands in for the cgroup or the process (tests only).
	processSource sampler.Source
	// memoryLimitSetter is the runtime's soft limit setter injected by
	// tests; see Start.
	memoryLimitSetter func(int64) int64
	// limitsEvery overrides the sampler's limits cadence (tests only).
	limitsEvery time.Duration

	engine     *decision.Engine
	tel        *telemetry
	classifier *middleware.Classifier
	retry      *middleware.RetryDelay
	// tarpit is shared by every HTTP server of this extension (nil = off).
	tarpit *middleware.Tarpit
	// adm decides and bounds the requests of every server of this
	// extension: the budget, the fair shares, the hold.
	adm *admission.Controller
	// downstream reads the exporters' queues on its own goroutine.
	downstream *downstream.Meter
	// demand is the demand signal (demand.go).
	demand demandMeter
	// unclassified warns of requests no route matches (unclassified.go).
	unclassified unclassifiedWarner
	// exempt[s]: signal s is admitted short of the memory backstop, within
	// the budget's reserve for exempt signals.
	exempt [decision.NumSignals]bool

	mu      sync.Mutex // guards the lifecycle below
	started bool
	stopped bool
	// samplerStopped is closed once the sampler has stopped and the owned
	// source is closed; nil before Shutdown.
	samplerStopped chan struct{}
	// flushed: the first Shutdown to see the sampler stopped flushes the
	// transition log.
	flushed sync.Once
	// closed is stopped for the sampler goroutine, which must not take mu.
	closed  atomic.Bool
	sampler *sampler.Sampler
	stale   *staleWatchdog // stale.go; nil when off
	// memLimit sets the Go soft memory limit when the throttle owns it;
	// nil before Start.
	memLimit *softlimit.Owner
	// pace raises the GC's pace while little is live (softlimit.GCPercent),
	// from the figures heapView read; both nil with an injected source.
	pace     *softlimit.GCPercent
	heapView *softlimit.HeapView
	// open times the state machine's Open episodes (stall.go).
	open openWatch

	status *status // status page and component status (status.go)

	// ownedSource is the source Start created (not injected), closed once
	// Shutdown has stopped the sampler, so its open cgroup or proc files are
	// released with the extension.
	ownedSource sampler.Source

	// Sampler goroutine only (and Shutdown once the sampler has stopped).
	lastWarn map[string]time.Time
	lastAt   time.Time
	translog *transitionLog
}

var (
	_ admission.Decider  = (*Runner)(nil)
	_ admission.Recorder = (*Runner)(nil)
)

// New builds the machinery of the extension id; nothing runs until Start.
func New(cfg Config, set component.TelemetrySettings, id component.ID, opts Options) (*Runner, error) {
	r := &Runner{
		cfg:           cfg,
		logger:        set.Logger,
		source:        opts.Source,
		processSource: opts.ProcessSource,

		memoryLimitSetter: opts.SetMemoryLimit,
		limitsEvery:       opts.LimitsEvery,
		lastWarn:          map[string]time.Time{},
	}
	relief := softlimit.NewRelief()
	r.downstream = downstream.New(cfg.Downstream, downstream.Options{
		Logger:  set.Logger,
		OnError: func(error) { r.tel.samplerError(downstream.Resource) },
	})
	r.resources = cfg.resources(func() { relief.Relieve() }, r.downstream.Read)
	r.translog = newTransitionLog(set.Logger, nil, r.resources)
	r.lines = decision.Config{Rules: cfg.Rules.Rules(), RecoveryRamp: cfg.RecoveryRamp, Interval: cfg.CheckInterval}
	for i := range r.resources {
		r.lines.Slots = append(r.lines.Slots, r.resources[i].slot(cfg.CheckInterval))
	}
	r.engine = decision.New(r.lines, decision.Options{OnTransition: r.logTransition})
	for s := range decision.NumSignals {
		r.exempt[s] = !cfg.Enabled || !r.lines.Rules[s].Enabled
	}
	var err error
	if r.classifier, err = middleware.NewClassifier(cfg.Routes.Routes()); err != nil {
		return nil, err
	}
	r.retry = middleware.NewRetryDelay(cfg.RetryAfter.Min, cfg.RetryAfter.Max, r.open.openFor, nil)
	adm, hold := cfg.Admission, cfg.Hold
	if !cfg.Enabled {
		// Disabled admits everything: no budget to wait for, no slow body
		// cut off, nothing refused to hold.
		adm.MaxInflightBytes, adm.IdleTimeout = admission.FixedInflightBudget(0), 0
		hold = admission.HoldConfig{}
	}
	// Until Start knows the memory limit and the cores, the budget is what
	// "auto" gives without a limit on this process's cores.
	r.adm, err = admission.New(adm, hold, admission.Settings{
		Decider:     r,
		Recorder:    r,
		ObserveOnly: cfg.ObserveOnly,
		Budget:      int64(adm.MaxInflightBytes.Resolve(0, float64(runtime.GOMAXPROCS(0)))), //nolint:gosec // G115: at most 1 TiB (Validate)
		HeldPool:    int64(admission.HeldPool(0)),                                           //nolint:gosec // G115: at most 256 MiB
	})
	if err != nil {
		return nil, err
	}
	r.tarpit = middleware.NewTarpit(cfg.Tarpit.Delay, cfg.Tarpit.MaxRequests, r.adm.Closing())
	r.unclassified.logger = set.Logger
	if r.tel, err = newTelemetry(set, id, cfg.ObserveOnly, r.telemetrySources()); err != nil {
		return nil, err
	}
	r.status = newStatus(r, set)
	r.status.stale = r.engine.Stale
	return r, nil
}

// Start starts the sampler. It is idempotent; with enabled: false it starts
// nothing and every decision admits.
func (r *Runner) Start(ctx context.Context, host component.Host) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || r.stopped {
		return nil
	}
	r.started = true
	if !r.cfg.Enabled {
		r.logger.Info("throttle disabled (enabled: false): admitting everything, no sampler")
		return nil
	}
	src := r.source
	// The heap view corrects the working set of this process, and the GC's
	// pace is this process's: only with the source that reads this
	// process's own cgroup or counters.
	ownProcess := src == nil
	if ownProcess {
		src = r.processSource
		if src == nil {
			src = defaultSource(r.logger)
		}
		r.ownedSource = src
	}
	if err := r.status.start(ctx, host, src); err != nil {
		return err
	}
	// The soft limit is derived from this process's own memory limit: an
	// injected source describes something else, and must not set it (a test
	// would squeeze its own process).
	glCfg := r.cfg.Memory.SoftLimit
	if r.source != nil && r.memoryLimitSetter == nil {
		glCfg.Enabled = false
	}
	r.memLimit = softlimit.Acquire(glCfg, softlimit.Options{SetMemoryLimit: r.memoryLimitSetter})
	var heap sampler.HeapView
	if ownProcess {
		r.pace = softlimit.AcquireGCPercent(glCfg.HeapTarget, softlimit.GCPercentOptions{})
		r.heapView = softlimit.NewHeapView(r.pace)
		heap = r.heapView
	}
	scfg := sampler.Config{
		Interval:    r.cfg.CheckInterval,
		CPU:         r.cfg.CPU.CPUConfig,
		Memory:      r.cfg.Memory.MemoryConfig,
		LimitsEvery: r.limitsEvery,
	}
	for i := range r.resources {
		scfg.Readers = append(scfg.Readers, r.resources[i].read)
	}
	r.sampler = sampler.New(src, scfg, sampler.Options{
		OnSample: r.onSample,
		OnError:  r.onSamplerError,
		Heap:     heap,
		Logger:   r.logger,
	})
	// Start takes the first sample before it returns, so the memory limit
	// is known when the budget and the soft memory limit are sized.
	if err := r.sampler.Start(ctx); err != nil {
		return fmt.Errorf("throttle: reading %s: %w", src.Describe(), err)
	}
	r.downstream.Start()
	r.stale = startStaleWatchdog(r.engine, r.logger, r.cfg.StaleAfter, r.cfg.CheckInterval, r.status.reportChange)
	wl := r.sampler.Load()
	r.resizeBudget(wl, true)
	goLimit := r.memLimit.Limit()
	r.status.goRuntimeSetBy(r.memLimit.Status().String(), r.pace.String())
	r.logger.Info("throttle started",
		zap.Bool("observe_only", r.cfg.ObserveOnly),
		zap.String("resource_source", src.Describe()),
		zap.Float64("effective_cores", wl.Cores),
		zap.Uint64("memory_limit_bytes", wl.MemLimit),
		zap.String("go_memory_limit", r.memLimit.Status().String()),
		zap.Int64("go_memory_limit_bytes", goMemLimitBytes(goLimit)),
		zap.String("gc_pace", r.pace.String()),
		zap.Int64("admission_budget_bytes", r.adm.Stats().Budget),
		zap.Duration("check_interval", r.cfg.CheckInterval),
	)
	return nil
}

// fullestQueue names the fullest exporter queue of the last read, when
// the downstream level is on and has been read.
func fullestQueue(m *downstream.Meter) zap.Field {
	q, ok := m.Fullest()
	if !ok {
		return zap.Skip()
	}
	return zap.String("fullest_queue", fmt.Sprintf("%s (%s) %.0f%% full", q.Exporter, q.Signal, 100*q.Fill()))
}

// defaultSource is the container's cgroup, or the process's own counters
// where there is none (bare metal, macOS, tests).
func defaultSource(logger *zap.Logger) sampler.Source {
	r, err := cgroup.NewReader("/")
	if err == nil {
		return r
	}
	logger.Info("no usable cgroup; reading the process's own CPU time and RSS instead", zap.Error(err))
	return cgroup.NewProcess("/")
}

// Shutdown stops the sampler and gives back what Start took: the soft
// memory limit and the GC percent return to what they were, and the source
// Start opened is closed. Safe without Start, and more than once.
//
// A source read that never returns (a hung filesystem) must not hang the
// collector's shutdown, nor leave the runtime settings to outlive the
// extension (a configuration reload would keep a limit nobody follows): the
// settings are released at once, and Shutdown waits for the sampler only as
// long as ctx allows. The source is closed when the sampler has stopped (it
// is not safe for concurrent use, and a read stuck in the kernel keeps its
// file until it returns anyway), whether or not a Shutdown is still
// waiting; a later Shutdown waits again, and completes once it has.
func (r *Runner) Shutdown(ctx context.Context) error {
	r.mu.Lock()
	var err error
	if !r.stopped {
		r.stopped = true
		r.closed.Store(true)
		r.adm.Close()
		err = r.status.shutdown(ctx)
		r.stale.stop()
		r.downstream.Stop()
		// A late sample's updates are no-ops once these are released.
		r.memLimit.Release()
		r.pace.Release()
		r.tel.shutdown()
		r.samplerStopped = make(chan struct{})
		go r.stopSampler(r.samplerStopped)
	}
	stopped := r.samplerStopped
	// Not held while waiting: another Shutdown must be able to give up
	// when its own ctx ends.
	r.mu.Unlock()
	select {
	case <-stopped:
	case <-ctx.Done():
		return errors.Join(err, fmt.Errorf("throttle: sampler did not stop: %w", ctx.Err()))
	}
	// Changes counted but not yet summarised would otherwise be lost.
	r.flushed.Do(r.translog.flush)
	return err
}

// stopSampler stops the sampler, waiting for a read in progress, then closes
// the source Start opened, so that its cgroup or proc files are released,
// and closes stopped.
func (r *Runner) stopSampler(stopped chan<- struct{}) {
	defer close(stopped)
	if r.sampler != nil {
		r.sampler.Stop()
	}
	if c, ok := r.ownedSource.(io.Closer); ok {
		_ = c.Close()
	}
}

// resizeBudget keeps the admission budget sized to the memory limit and
// the cores in force: both can change while the collector runs (an
// in-place pod resize, a move to another cgroup). first: Start's sizing,
// which is not logged as a change.
func (r *Runner) resizeBudget(wl *sampler.WaterLevel, first bool) {
	a := r.cfg.Admission.MaxInflightBytes
	if a.IsOff() || !r.cfg.Enabled {
		return // no budget: disabled admits everything
	}
	want := int64(a.Resolve(wl.MemLimit, wl.Cores)) //nolint:gosec // G115: at most 1 TiB (Validate) or 256 MiB (auto)
	prev := r.adm.Stats().Budget
	r.adm.SetBudget(want, int64(admission.HeldPool(wl.MemLimit))) //nolint:gosec // G115: at most 256 MiB
	if !first && want != prev {
		r.logger.Info("throttle: the admission budget follows the memory limit and the cores",
			zap.Int64("admission_budget_bytes", want), zap.Uint64("memory_limit_bytes", wl.MemLimit), zap.Float64("effective_cores", wl.Cores))
	}
}

// goMemLimitBytes is a soft limit for logs and telemetry: 0 for none.
func goMemLimitBytes(l int64) int64 {
	if l == math.MaxInt64 {
		return 0
	}
	return l
}

// onSample runs on the sampler goroutine after each publish.
func (r *Runner) onSample(wl *sampler.WaterLevel, took time.Duration) {
	// A read that hung through Shutdown returns later: what it measured
	// goes nowhere, the extension is shut down.
	if r.closed.Load() {
		return
	}
	// The first tick runs inside Start, which logs the limit it set.
	if limit, changed := r.memLimit.Update(wl.MemLimit); changed && !r.lastAt.IsZero() {
		r.logger.Info("throttle: the Go soft memory limit follows the memory limit",
			zap.Uint64("memory_limit_bytes", wl.MemLimit), zap.Int64("go_memory_limit_bytes", goMemLimitBytes(limit)))
	}
	r.pace.Update(wl.MemLimit, r.memLimit.Limit(), wl.WorkingSet, r.heapView.Last())
	r.resizeBudget(wl, false)
	r.engine.Observe(wl)
	admitted, refused := decisionTotals(&r.tel.counts)
	st := r.adm.Stats()
	level, backendBound := demandLevel(r.resources, wl)
	r.demand.observe(wl.At, level, backendBound, admitted, refused, st.Inflight, st.HeldRequests)
	if started, ended := r.open.observe(r.engine.State(decision.SignalTraces) == decision.StateOpen); started {
		r.logger.Warn("throttle: Open for 30s without a break: the collector is not draining what it holds (check its exporters and queues); every throttled request is refused until the level at its hard line falls below it",
			append(levelFields(r.resources, wl),
				zap.Uint64("working_set_bytes", wl.WorkingSet),
				zap.Uint64("heap_spare_bytes", wl.HeapSpare),
				zap.Uint64("heap_held_back_bytes", wl.HeapHeldBack),
				zap.Uint64("memory_limit_bytes", wl.MemLimit),
				fullestQueue(r.downstream),
			)...,
		)
		r.status.reportChange()
	} else if ended > 0 {
		r.logger.Info("throttle: the stalled Open has ended", zap.Duration("open_for", ended))
		r.status.reportChange()
	}
	r.translog.tick()
	r.status.record(wl)
	var interval time.Duration
	if !r.lastAt.IsZero() {
		interval = wl.At.Sub(r.lastAt)
	}
	r.lastAt = wl.At
	r.tel.sampled(took, interval)
}

// onSamplerError counts every failure and logs each kind at most once per
// warnEvery.
func (r *Runner) onSamplerError(err error) {
	resource := errorResource(err)
	r.tel.samplerError(resource)
	now := time.Now()
	if last, ok := r.lastWarn[resource]; ok && now.Sub(last) < warnEvery {
		return
	}
	r.lastWarn[resource] = now
	r.logger.Warn("throttle sampler: resource read failed or frame skipped (logged at most every 30s per resource)",
		zap.String("resource", resource), zap.Error(err))
}

// errorResource names the resource a sampler error is about, for the
// sampler_errors metric and the rate limit of its log.
func errorResource(err error) string {
	var re *sampler.ReadError
	if errors.As(err, &re) {
		return re.Resource
	}
	return "cpu" // skipped CPU windows
}

// logTransition logs one state change (sampler goroutine) and lists it on
// the status page. The message names the signal and both states;
// transitionLog keeps a flapping state from losing its changes to the
// collector's log sampling (see transitionlog.go).
func (r *Runner) logTransition(t decision.Transition) {
	r.translog.transition(t)
	r.status.transition(t)
}

// Decide implements the extension's Throttle, for the processor. The
// engine already admits a signal whose rule is disabled, short of the
// memory backstop, and with enabled: false nothing feeds it, so it stays
// Normal and admits everything.
func (r *Runner) Decide(s decision.Signal) decision.Verdict { return r.engine.Decide(s) }

// Pressure implements admission.Decider.
func (r *Runner) Pressure(s decision.Signal) (bool, float64) { return r.engine.Pressure(s) }

// Exempt implements middleware.Decider.
func (r *Runner) Exempt(s decision.Signal) bool {
	return s < decision.NumSignals && r.exempt[s]
}

// State is the current state of signal s's state machine.
func (r *Runner) State(s decision.Signal) decision.State { return r.engine.State(s) }

// Pressed implements middleware.Decider: s is not Normal, or a water level
// is past its exit line (the state has not changed yet, but a burst that
// costs more would take it there).
func (r *Runner) Pressed(s decision.Signal) bool {
	if r.engine.State(s) != decision.StateNormal {
		return true
	}
	wl := r.engine.Level()
	for i, slot := range r.lines.Slots {
		if l := &wl.Levels[i]; slot.Enabled && l.Valid && l.Slow >= slot.Exit {
			return true
		}
	}
	return false
}

// Holdable implements admission.Decider.
func (r *Runner) Holdable(s decision.Signal) bool { return r.engine.Holdable(s) }

// RetryDelay draws the delay a client rejected with v is asked to wait.
func (r *Runner) RetryDelay(v decision.Verdict) time.Duration { return r.retry.Draw(v) }

// ObserveOnly reports whether decisions are only counted (observe_only).
func (r *Runner) ObserveOnly() bool { return r.cfg.ObserveOnly }

// RecordProcessorDecision counts a decision taken by a processor.
func (r *Runner) RecordProcessorDecision(s decision.Signal, v decision.Verdict) {
	r.tel.record(admission.ProtocolProcessor, s, v)
}

// Record implements admission.Recorder.
func (r *Runner) Record(p admission.Protocol, s decision.Signal, v decision.Verdict) {
	r.tel.record(p, s, v)
}

// CutOff implements admission.Recorder.
func (r *Runner) CutOff(p admission.Protocol, s decision.Signal, c admission.CutReason) {
	r.tel.cutOff(p, s, c)
}

// MiddlewareConfig is the configuration of one server's middleware: every
// server of the extension shares the runner's classifier, budget, tarpit
// and hold. The budget is the one Start sized (nil before Start).
func (r *Runner) MiddlewareConfig() middleware.Config {
	return middleware.Config{
		Classifier:   r.classifier,
		Admission:    r.adm,
		Retry:        r.retry,
		Unclassified: r.unclassified.warn,
		Tarpit:       r.tarpit,
	}
}

// level is the last water level the engine observed, nil before the first
// sample. It takes no lock: metric callbacks call it, and Shutdown holds r.mu
// while it unregisters them, which waits for a collection in progress.
func (r *Runner) level() *sampler.WaterLevel {
	wl := r.engine.Level()
	if wl == nil || wl.At.IsZero() {
		return nil
	}
	return wl
}

// NotReady tells the runner the receivers are about to stop: every held
// request is refused and every unfinished one cut off within a second, so
// that the receivers' servers stop whatever the clients do (with a budget:
// its tickets are what is cut off).
func (r *Runner) NotReady() { r.adm.Close() }

func (r *Runner) budgetValues() (reserved, limit int64) {
	st := r.adm.Stats()
	return st.Reserved, st.Budget
}

// topKeys is how many client keys the telemetry and the status page show by
// name; the others are summed as "other", so that the series stay few
// however many clients there are.
const topKeys = 10

// mode is the mode in force, as the throttle_mode gauge names it.
func (r *Runner) mode() string {
	switch {
	case !r.cfg.Enabled:
		return "disabled"
	case r.cfg.ObserveOnly:
		return "observe_only"
	}
	return "enforcing"
}

func (r *Runner) telemetrySources() telemetrySources {
	return telemetrySources{
		level:      r.level,
		state:      r.State,
		budget:     r.budgetValues,
		stale:      r.engine.Stale,
		held:       func() int64 { return r.tarpit.Held() + r.adm.Stats().HeldRequests },
		goMemLimit: func() int64 { return goMemLimitBytes(softlimit.Current()) },
		gcPercent:  softlimit.CurrentGCPercent,
		openFor:    r.open.openFor,
		demand:     r.demand.load,
		topKeys:    func() ([]admission.KeyStat, admission.KeyStat) { return r.adm.TopKeys(topKeys) },
		mode:       r.mode(),
		resources:  r.resources,
		slots:      r.lines.Slots,
	}
}
