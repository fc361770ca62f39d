// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"context"
	"time"
)

// Background runs f in a goroutine until stop is called: stop cancels f's
// context and waits for f to return, so that nothing f writes outlives it.
// The samplers and scrapers of every benchmark run this way.
func Background(f func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// Every calls f at once and then every interval, until ctx ends.
func Every(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		f()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
