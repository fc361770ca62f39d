// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package testutil // import "github.com/otelthrottle/throttle/internal/testutil"

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
)

// StatusHost is a host, with no extensions, that records the component
// status events reported to it, as the service's host does.
type StatusHost struct {
	mu     sync.Mutex
	events []*componentstatus.Event
	ch     chan *componentstatus.Event
}

var (
	_ component.Host           = (*StatusHost)(nil)
	_ componentstatus.Reporter = (*StatusHost)(nil)
)

// statusHostBacklog is how many events a StatusHost holds for Next before
// Report blocks.
const statusHostBacklog = 100

// NewStatusHost returns a host with no events recorded.
func NewStatusHost() *StatusHost {
	return &StatusHost{ch: make(chan *componentstatus.Event, statusHostBacklog)}
}

func (*StatusHost) GetExtensions() map[component.ID]component.Component { return nil }

func (h *StatusHost) Report(ev *componentstatus.Event) {
	h.mu.Lock()
	h.events = append(h.events, ev)
	h.mu.Unlock()
	h.ch <- ev
}

// Recorded returns every event reported so far, oldest first.
func (h *StatusHost) Recorded() []*componentstatus.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]*componentstatus.Event(nil), h.events...)
}

// Next waits for the next reported event; the timeout only bounds a failing
// test.
func (h *StatusHost) Next(tb testing.TB) *componentstatus.Event {
	tb.Helper()
	select {
	case ev := <-h.ch:
		return ev
	case <-time.After(10 * time.Second):
		require.FailNow(tb, "no component status event reported")
		return nil
	}
}
