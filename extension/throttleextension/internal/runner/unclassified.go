// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/otelthrottle/throttle/internal/admission"
)

// unclassifiedEvery is how often at most the unclassified requests are
// warned of.
const unclassifiedEvery = time.Minute

// unclassifiedWarner warns that requests reach a protected server on a path
// or method no route matches: they pass untouched, so a receiver serving a
// custom path (otlpreceiver's traces_url_path, say) without a matching
// `routes` entry is not protected at all. The first is warned of at once,
// then at most once a minute with how many came meanwhile; the request
// path pays an atomic add and a load.
type unclassifiedWarner struct {
	logger *zap.Logger
	count  atomic.Int64
	warned atomic.Int64 // unix nanoseconds of the last warning
}

func (u *unclassifiedWarner) warn(p admission.Protocol, path string) {
	n := u.count.Add(1)
	last := u.warned.Load()
	t := time.Now().UnixNano()
	if (last != 0 && t-last < int64(unclassifiedEvery)) || !u.warned.CompareAndSwap(last, t) {
		return
	}
	u.count.Add(-n)
	u.logger.Warn("requests on a protected server match no route and pass untouched; add their paths or methods to routes",
		zap.String("protocol", p.String()), zap.String("example", path), zap.Int64("requests", n))
}
