// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import "context"

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
