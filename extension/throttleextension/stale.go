package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/decision"
)

// staleWatchdog bounds how long decisions act on an old water level
// (stale_after_intervals). Every sample interval it asks the engine whether
// Observe has run within the bound; when not, the engine publishes admit-all
// snapshots until the next sample (decision.Engine.Expire).
//
// Why fall back to admitting rather than hold: a sampler that is stuck (a
// read blocked in the kernel, a deadlocked source, a bug) would otherwise
// leave the throttle rejecting everything for ever on a level nobody
// measures any more. A protection that fails must fail open, and say so: a
// Warn log, the throttle_sampler_stale gauge, the status page. The risk is
// the other way round: the sampler is most likely to be starved when the
// collector is overloaded, and a false "stale" lets a flood in; that is why
// the default bound is generous (see defaultStaleAfterIntervals) and why 0
// keeps the hold for those who prefer it.
//
// It runs on its own goroutine so that it keeps running while the sampler's
// goroutine is blocked. The request path is unchanged: Decide still loads
// one pointer, and never reads the clock.
type staleWatchdog struct {
	engine   *decision.Engine
	logger   *zap.Logger
	maxAge   time.Duration
	interval time.Duration
	// onChange is called when the fallback starts or ends, so that the
	// reported component status follows what Decide does.
	onChange func()
	done     chan struct{}
	wg       sync.WaitGroup
}

// startStaleWatchdog starts the watchdog, or returns nil when the bound is
// off (stale_after_intervals: 0).
func startStaleWatchdog(engine *decision.Engine, logger *zap.Logger, cfg *Config, onChange func()) *staleWatchdog {
	maxAge := cfg.StaleAfter()
	if maxAge <= 0 {
		return nil
	}
	w := &staleWatchdog{
		onChange: onChange,
		engine:   engine,
		logger:   logger,
		maxAge:   maxAge,
		interval: cfg.SampleInterval,
		done:     make(chan struct{}),
	}
	w.wg.Go(w.run)
	return w
}

func (w *staleWatchdog) run() {
	ticker := time.NewTicker(w.interval)
	defer ticker.Stop()
	stale := false
	var since time.Time
	for {
		select {
		case <-w.done:
			return
		case <-ticker.C:
		}
		now := w.engine.Expire(w.maxAge)
		switch {
		case now && !stale:
			since = w.engine.ObservedAt()
			w.logger.Warn("throttle: no fresh water level; admitting every signal until the sampler publishes one",
				zap.Duration("since_last_sample", time.Since(since)),
				zap.Duration("stale_after", w.maxAge),
			)
		case !now && stale:
			w.logger.Info("throttle: fresh water level again; decisions act on it",
				zap.Duration("gap", w.engine.ObservedAt().Sub(since)),
			)
		}
		if now != stale {
			w.onChange()
		}
		stale = now
	}
}

// stop stops the watchdog and waits for it; safe on nil.
func (w *staleWatchdog) stop() {
	if w == nil {
		return
	}
	close(w.done)
	w.wg.Wait()
}
