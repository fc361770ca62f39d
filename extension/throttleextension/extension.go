// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/extension"
	"go.opentelemetry.io/collector/extension/extensionmiddleware"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/gomemlimit"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
)

// warnEvery bounds how often one kind of sampler failure is logged: the
// sampler ticks 4 times a second and a broken file would flood the log.
const warnEvery = 30 * time.Second

// throttleExtension is the throttle extension: it owns the sampler and the
// engine, and hands decisions to the middleware and the processor.
type throttleExtension struct {
	cfg    *Config
	id     component.ID
	logger *zap.Logger
	source ResourceSource // injected by tests; nil = cgroup, else process
	// memoryLimitSetter is the runtime's soft limit setter injected by
	// tests; see Start.
	memoryLimitSetter func(int64) int64
	// limitsEvery overrides the sampler's limits cadence (tests only).
	limitsEvery time.Duration

	engine     *decision.Engine
	tel        *telemetry
	classifier *middleware.Classifier
	retry      *middleware.RetryDelay
	// pacer is shared by every HTTP server of this extension (nil = off).
	pacer *middleware.Pacer
	// queue is shared by every HTTP server of this extension (nil = off).
	queue *middleware.Queue
	// exempt[s]: signal s is always admitted and bypasses the budget.
	exempt [decision.NumSignals]bool

	// budget is shared by every server of this extension; set at Start once
	// the memory limit is known (nil = no budget).
	budget atomic.Pointer[middleware.Budget]

	mu      sync.Mutex // guards the lifecycle below
	started bool
	stopped bool
	// closed is stopped for the sampler goroutine, which must not take mu.
	closed  atomic.Bool
	sampler *sampler.Sampler
	stale   *staleWatchdog // stale.go; nil when off
	// memLimit sets the Go soft memory limit when the throttle owns it;
	// nil before Start.
	memLimit *gomemlimit.Owner
	// open times the state machine's Open episodes (stall.go).
	open openWatch

	status *extensionStatus // status page and component status (status.go)

	// ownedSource is the source Start created (not injected), closed at
	// Shutdown so its open cgroup or proc files are released at once.
	ownedSource ResourceSource

	// Sampler goroutine only (and Shutdown once the sampler has stopped).
	lastWarn map[string]time.Time
	lastAt   time.Time
	translog *transitionLog
}

var (
	_ extension.Extension            = (*throttleExtension)(nil)
	_ extensionmiddleware.HTTPServer = (*throttleExtension)(nil)
	_ extensionmiddleware.GRPCServer = (*throttleExtension)(nil)
	_ Throttle                       = (*throttleExtension)(nil)
	_ middleware.Decider             = (*throttleExtension)(nil)
	_ middleware.Recorder            = (*throttleExtension)(nil)
)

func newExtension(cfg *Config, set extension.Settings, fo factoryOptions) (*throttleExtension, error) {
	e := &throttleExtension{
		cfg:    cfg,
		id:     set.ID,
		logger: set.Logger,
		source: fo.source,

		memoryLimitSetter: fo.memoryLimit,
		limitsEvery:       fo.limitsEvery,
		lastWarn:          map[string]time.Time{},
		translog:          newTransitionLog(set.Logger, nil),
	}
	relief := gomemlimit.NewRelief()
	e.engine = decision.New(cfg.decisionConfig(), decision.Options{
		OnTransition:  e.logTransition,
		RelieveMemory: func() { relief.Relieve() },
	})
	for s := range decision.NumSignals {
		e.exempt[s] = !cfg.Enabled || !cfg.RuleFor(s).Enabled
	}
	var err error
	if e.classifier, err = middleware.NewClassifier(cfg.middlewareRoutes()); err != nil {
		return nil, err
	}
	e.retry = middleware.NewRetryDelay(cfg.RetryAfter.Min, cfg.RetryAfter.Max, nil)
	e.pacer = middleware.NewPacer(cfg.Pacing.Delay, cfg.Pacing.MaxHeld)
	if cfg.Enabled {
		e.queue = middleware.NewQueue(e, cfg.Queue.MaxWait, cfg.Queue.MaxHeld, 0)
	}
	if e.tel, err = newTelemetry(set.TelemetrySettings, set.ID, e.telemetrySources()); err != nil {
		return nil, err
	}
	e.status = newExtensionStatus(e, set.TelemetrySettings)
	e.status.stale = e.engine.Stale
	return e, nil
}

// Start starts the sampler. It is idempotent; with enabled: false it starts
// nothing and every decision admits.
func (e *throttleExtension) Start(ctx context.Context, host component.Host) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.started || e.stopped {
		return nil
	}
	e.started = true
	if !e.cfg.Enabled {
		e.logger.Info("throttle disabled (enabled: false): admitting everything, no sampler")
		return nil
	}
	src := e.source
	// The heap view corrects the working set of this process: only with
	// the source that reads this process's own cgroup or counters.
	var heap sampler.HeapView
	if src == nil {
		src = defaultSource(e.logger)
		e.ownedSource = src
		heap = gomemlimit.NewHeapView()
	}
	if err := e.status.start(ctx, host, src); err != nil {
		return err
	}
	// The soft limit is derived from this process's own memory limit: an
	// injected source describes something else, and must not set it (a test
	// would squeeze its own process).
	glCfg := e.cfg.GoMemLimit.ownerConfig()
	if e.source != nil && e.memoryLimitSetter == nil {
		glCfg.Enabled = false
	}
	e.memLimit = gomemlimit.Acquire(glCfg, gomemlimit.Options{SetMemoryLimit: e.memoryLimitSetter})
	scfg := e.cfg.samplerConfig()
	scfg.LimitsEvery = e.limitsEvery
	e.sampler = sampler.New(src, scfg, sampler.Options{
		OnSample: e.onSample,
		OnError:  e.onSamplerError,
		Heap:     heap,
	})
	// Start takes the first sample before it returns, so the memory limit
	// is known when the budget and the soft memory limit are sized.
	if err := e.sampler.Start(ctx); err != nil {
		return fmt.Errorf("throttle: reading %s: %w", src.Describe(), err)
	}
	e.stale = startStaleWatchdog(e.engine, e.logger, e.cfg, e.status.reportChange)
	wl := e.sampler.Load()
	if !e.cfg.Admission.MaxInflightBytes.Off() {
		e.budget.Store(middleware.NewBudgetWith(middleware.BudgetConfig{
			Max:       int64(e.cfg.Admission.MaxInflightBytes.ResolveBudget(wl.MemLimit, wl.Cores)), //nolint:gosec // G115: at most 1 TiB (Validate) or 256 MiB (auto)
			PeerShare: e.cfg.Admission.PeerShare,
			Wait:      e.cfg.Admission.WaitTimeout,
		}))
	}
	goLimit := e.memLimit.Limit()
	e.logger.Info("throttle started",
		zap.String("resource_source", src.Describe()),
		zap.Float64("effective_cores", wl.Cores),
		zap.Uint64("memory_limit_bytes", wl.MemLimit),
		zap.String("go_memory_limit", e.memLimit.Status().String()),
		zap.Int64("go_memory_limit_bytes", goMemLimitBytes(goLimit)),
		zap.Int64("admission_budget_bytes", e.budget.Load().Max()),
		zap.Duration("sample_interval", e.cfg.SampleInterval),
	)
	return nil
}

// defaultSource is the container's cgroup, or the process's own counters
// where there is none (bare metal, macOS, tests).
func defaultSource(logger *zap.Logger) ResourceSource {
	r, err := cgroup.NewReader("/")
	if err == nil {
		return r
	}
	logger.Info("no usable cgroup; reading the process's own CPU time and RSS instead", zap.Error(err))
	return cgroup.NewProcess("/")
}

// Shutdown stops the sampler and waits for it. Safe without Start, and more
// than once.
func (e *throttleExtension) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return nil
	}
	e.stopped = true
	e.closed.Store(true)
	e.queue.Close()
	err := e.status.shutdown(ctx)
	e.stale.stop()
	if e.sampler != nil {
		// A source read that never returns (a hung filesystem) must not
		// hang the collector's shutdown: wait for the sampler only as long
		// as ctx allows, and leave the source open if it is still in use.
		stopped := make(chan struct{})
		go func() {
			e.sampler.Stop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-ctx.Done():
			e.tel.shutdown()
			return errors.Join(err, fmt.Errorf("throttle: sampler did not stop: %w", ctx.Err()))
		}
		// Changes counted but not yet summarised would otherwise be lost.
		e.translog.flush()
	}
	if c, ok := e.ownedSource.(io.Closer); ok {
		_ = c.Close()
	}
	e.memLimit.Release()
	e.tel.shutdown()
	return err
}

// resizeBudget keeps an "auto" admission budget sized to the memory limit
// and the cores in force: both can change while the collector runs (an
// in-place pod resize, a move to another cgroup).
func (e *throttleExtension) resizeBudget(wl *sampler.WaterLevel) {
	b := e.budget.Load()
	if b == nil || !e.cfg.Admission.MaxInflightBytes.Auto() {
		return
	}
	if want := int64(e.cfg.Admission.MaxInflightBytes.ResolveBudget(wl.MemLimit, wl.Cores)); want != b.Max() { //nolint:gosec // G115: at most 1 TiB (Validate) or 256 MiB (auto)
		b.SetMax(want)
		e.logger.Info("throttle: the admission budget follows the memory limit and the cores",
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
func (e *throttleExtension) onSample(wl *sampler.WaterLevel, took time.Duration) {
	// A read that hung through Shutdown returns later: what it measured
	// goes nowhere, the extension is shut down.
	if e.closed.Load() {
		return
	}
	// The first tick runs inside Start, which logs the limit it set.
	if limit, changed := e.memLimit.Update(wl.MemLimit); changed && !e.lastAt.IsZero() {
		e.logger.Info("throttle: the Go soft memory limit follows the memory limit",
			zap.Uint64("memory_limit_bytes", wl.MemLimit), zap.Int64("go_memory_limit_bytes", goMemLimitBytes(limit)))
	}
	e.resizeBudget(wl)
	e.engine.Observe(wl)
	if started, ended := e.open.observe(e.engine.State(decision.Traces) == decision.Open); started {
		e.logger.Warn("throttle: Open for 30s without a break: the collector is not draining what it holds (check its exporters and queues); every throttled request is refused until memory falls",
			zap.Float64("mem", wl.Mem),
			zap.Uint64("working_set_bytes", wl.WorkingSet),
			zap.Uint64("heap_free_bytes", wl.HeapFree),
			zap.Uint64("heap_held_back_bytes", wl.HeapHeldBack),
			zap.Uint64("memory_limit_bytes", wl.MemLimit),
			zap.Float64("cpu", wl.CPU),
		)
		e.status.reportChange()
	} else if ended > 0 {
		e.logger.Info("throttle: the stalled Open has ended", zap.Duration("open_for", ended))
		e.status.reportChange()
	}
	e.translog.tick()
	e.status.record(wl)
	var interval time.Duration
	if !e.lastAt.IsZero() {
		interval = wl.At.Sub(e.lastAt)
	}
	e.lastAt = wl.At
	e.tel.sampled(took, interval)
}

// onSamplerError counts every failure and logs each kind at most once per
// warnEvery.
func (e *throttleExtension) onSamplerError(err error) {
	resource := errorResource(err)
	e.tel.samplerError(resource)
	now := time.Now()
	if last, ok := e.lastWarn[resource]; ok && now.Sub(last) < warnEvery {
		return
	}
	e.lastWarn[resource] = now
	e.logger.Warn("throttle sampler: resource read failed or frame skipped (logged at most every 30s per resource)",
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

// logTransition logs one state change (sampler goroutine). The message
// names the signal and both states; transitionLog keeps a flapping state
// from losing its changes to the collector's log sampling (see
// transitionlog.go).
func (e *throttleExtension) logTransition(t decision.Transition) {
	e.translog.transition(t)
}

// Decide implements Throttle and middleware.Decider. The engine already
// admits a signal whose rule is disabled, and with enabled: false nothing
// feeds it, so it stays Normal and admits everything.
func (e *throttleExtension) Decide(s Signal) Verdict { return e.engine.Decide(s) }

// Exempt implements middleware.Decider.
func (e *throttleExtension) Exempt(s Signal) bool {
	return s < decision.NumSignals && e.exempt[s]
}

// State implements Throttle.
func (e *throttleExtension) State(s Signal) State { return e.engine.State(s) }

// RetryDelay implements Throttle.
func (e *throttleExtension) RetryDelay(v Verdict) time.Duration { return e.retry.Draw(v) }

// ObserveOnly implements Throttle.
func (e *throttleExtension) ObserveOnly() bool { return e.cfg.ObserveOnly }

// RecordProcessorDecision implements Throttle.
func (e *throttleExtension) RecordProcessorDecision(s Signal, v Verdict) {
	e.tel.record(middleware.ProtocolProcessor, s, v)
}

// Record implements middleware.Recorder.
func (e *throttleExtension) Record(p middleware.Protocol, s decision.Signal, v decision.Verdict) {
	e.tel.record(p, s, v)
}

func (e *throttleExtension) middlewareConfig() middleware.Config {
	return middleware.Config{
		Classifier:  e.classifier,
		Decider:     e,
		Retry:       e.retry,
		Budget:      e.budget.Load(),
		UnknownSize: int64(e.cfg.Admission.UnknownSize), //nolint:gosec // G115: at most 1 TiB (Validate)
		IdleTimeout: e.cfg.Admission.IdleTimeout,
		Recorder:    e,
		Pacer:       e.pacer,
		Queue:       e.queue,
		ObserveOnly: e.cfg.ObserveOnly,
	}
}

// GetHTTPHandler implements extensionmiddleware.HTTPServer: the receiver's
// handler is wrapped so that requests are decided before their body is read.
func (e *throttleExtension) GetHTTPHandler(context.Context) (extensionmiddleware.WrapHTTPHandlerFunc, error) {
	return func(_ context.Context, next http.Handler) (http.Handler, error) {
		m, err := middleware.NewHTTP(e.middlewareConfig())
		if err != nil {
			return nil, err
		}
		return m.Wrap(next), nil
	}, nil
}

// GetGRPCServerOptions implements extensionmiddleware.GRPCServer: a tap
// handle decides when a stream's headers arrive, before any message is read.
// grpc-go allows one tap handle per server.
func (e *throttleExtension) GetGRPCServerOptions(context.Context) ([]grpc.ServerOption, error) {
	m, err := middleware.NewGRPC(e.middlewareConfig())
	if err != nil {
		return nil, err
	}
	return m.ServerOptions(), nil
}

// level is the last water level the engine observed, nil before the first
// sample. It takes no lock: metric callbacks call it, and Shutdown holds e.mu
// while it unregisters them, which waits for a collection in progress.
func (e *throttleExtension) level() *sampler.WaterLevel {
	wl := e.engine.Level()
	if wl == nil || wl.At.IsZero() {
		return nil
	}
	return wl
}

func (e *throttleExtension) budgetValues() (reserved, limit int64) {
	b := e.budget.Load()
	return b.Reserved(), b.Max()
}

func (e *throttleExtension) telemetrySources() telemetrySources {
	c := e.cfg.Thresholds
	return telemetrySources{
		level:      e.level,
		state:      e.State,
		budget:     e.budgetValues,
		stale:      e.engine.Stale,
		held:       func() int64 { return e.pacer.Held() + e.queue.Held() },
		goMemLimit: func() int64 { return goMemLimitBytes(gomemlimit.Current()) },
		openFor:    e.open.openFor,
		lines:      [6]float64{c.CPU.Enter, c.CPU.Exit, c.CPU.Hard, c.Mem.Enter, c.Mem.Exit, c.Mem.Hard},
		cpuEnabled: c.CPU.Enabled,
		memEnabled: c.Mem.Enabled,
	}
}
