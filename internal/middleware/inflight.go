// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import "sync/atomic"

// Inflight counts the admitted requests that have not finished, over every
// server of an extension: set against the requests held, it tells how much
// longer than needed the clients wait (the demand signal, design §9). A nil
// *Inflight counts nothing. gRPC calls are counted only while the admission
// budget is on (they are followed through their reservation).
type Inflight struct{ n atomic.Int64 }

// Load returns the admitted requests not finished yet.
func (c *Inflight) Load() int64 {
	if c == nil {
		return 0
	}
	return c.n.Load()
}

func (c *Inflight) add(d int64) {
	if c != nil {
		c.n.Add(d)
	}
}
