// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/decision"
)

// staleWatchdog bounds how long decisions act on an old water level
// (stale_after). Every check interval it asks the engine whether
// Observe has run within the bound; when not, the engine publishes admit-all
// snapshots until the next sample (decision.Engine.Expire).
//
// Why fall back to admitting rather than hold: a sampler that is stuck (a
// read blocked in the kernel, a deadlocked source, a bug) would otherwise
// leave the throttle rejecting everything for ever on a level nobody
// measures any more. A protection that fails must fail open, and say so: a
// Warn log, the throttle_sampler_stale gauge, the status page.
//
// The risk is the other way round: the sampler is most likely to be late
// when the whole collector is starved of CPU, which is when the throttle is
// needed most, and a false "stale" lets a flood in. So the bound counts the
// watchdog's own ticks, and only those that came on time: a starved process
// runs its watchdog late too, and a sampler is called stuck only when the
// watchdog ran on time for stale_after's worth of ticks in a row while the
// sampler published nothing. 0 keeps the hold for those who prefer it.
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

// startStaleWatchdog starts the watchdog, ticking every check interval,
// or returns nil when the bound maxAge is off (stale_after: 0).
func startStaleWatchdog(engine *decision.Engine, logger *zap.Logger, maxAge, interval time.Duration, onChange func()) *staleWatchdog {
	if maxAge <= 0 {
		return nil
	}
	w := &staleWatchdog{
		onChange: onChange,
		engine:   engine,
		logger:   logger,
		maxAge:   maxAge,
		interval: interval,
		done:     make(chan struct{}),
	}
	w.wg.Go(w.run)
	return w
}

func (w *staleWatchdog) run() {
	ticker := time.NewTicker(w.interval)
	defer ticker.Stop()
	c := staleCounter{interval: w.interval, need: int(w.maxAge / w.interval)}
	stale := false
	var since time.Time
	for {
		select {
		case <-w.done:
			return
		case <-ticker.C:
		}
		now := false
		if c.tick(time.Now(), w.engine.ObservedAt()) {
			now = w.engine.Expire(w.maxAge)
		}
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

// staleCounter counts the watchdog's ticks that came on time since the
// sampler last published.
type staleCounter struct {
	interval time.Duration
	// need is how many on-time ticks without a publication make the level
	// stale.
	need     int
	onTime   int
	lastTick time.Time
	observed time.Time
}

// lateTick: a tick more than this many intervals after the previous one
// came late, the process did not run the watchdog on time.
const lateTick = 2

// tick takes one tick at now, with the sampler's last publication at
// observed, and reports whether the sampler has missed need on-time ticks.
func (c *staleCounter) tick(now, observed time.Time) bool {
	if !observed.Equal(c.observed) {
		c.observed, c.onTime = observed, 0
	}
	if c.lastTick.IsZero() || now.Sub(c.lastTick) <= lateTick*c.interval {
		c.onTime++
	}
	c.lastTick = now
	return c.onTime >= c.need
}

// stop stops the watchdog and waits for it; safe on nil.
func (w *staleWatchdog) stop() {
	if w == nil {
		return
	}
	close(w.done)
	w.wg.Wait()
}
