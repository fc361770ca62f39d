// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package exporters

// End-to-end tests of the throttle extension with the real OTLP exporters
// as clients: the real otlpreceiver with middlewares: [{id: throttle}] on
// its gRPC and HTTP servers, a started throttle extension whose state is
// driven through its resource source (the real sampler and state machines
// decide), and otlphttpexporter and otlpexporter sending every signal.
// Moved from extension/throttleextension/e2e_test.go, whose other tests use
// raw net/http and grpc-go clients; helpers in extension_helpers_test.go.

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// TestE2ENormalAdmitsEverything: in Normal every signal sent by the real
// exporters of both protocols reaches the sinks, exactly, and each decision
// is counted as allowed.
func TestE2ENormalAdmitsEverything(t *testing.T) {
	env := startE2E(t, nil)
	ctx := context.Background()
	const perExport = 10
	for _, protocol := range []string{"http", "grpc"} {
		exps := env.startExporters(t, protocol)
		for _, s := range e2eSignals {
			require.NoError(t, exps.send[s.sig](ctx, perExport), "%s %v", protocol, s.sig)
		}
	}
	for _, s := range e2eSignals {
		assert.Equal(t, 2*perExport, s.received(env), "%v items at the sink", s.sig)
		for _, protocol := range []string{"http", "grpc"} {
			assert.EqualValues(t, 1, env.requests(t, protocol, s.sig, "allowed", ""), "%s %v allowed", protocol, s.sig)
			assert.Zero(t, env.requests(t, protocol, s.sig, "denied", "open"))
			assert.Zero(t, env.requests(t, protocol, s.sig, "denied", "shed"))
		}
	}
}

// TestE2EExportersRetryUntilNormal: exports started in Open are rejected,
// retried by the exporters (429 + Retry-After, RESOURCE_EXHAUSTED +
// RetryInfo) and all delivered, exactly once, when the state returns to
// Normal: nothing is lost.
func TestE2EExportersRetryUntilNormal(t *testing.T) {
	env := startE2E(t, nil)
	env.setLevel(t, e2eOpen, decision.StateOpen)
	protocols := []string{"http", "grpc"}
	items := map[string]int{"http": 11, "grpc": 13}

	ctx, cancel := context.WithTimeout(context.Background(), e2eWait)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, len(protocols)*len(e2eSignals))
	for _, protocol := range protocols {
		exps := env.startExporters(t, protocol)
		for _, s := range e2eSignals {
			wg.Go(func() {
				if err := exps.send[s.sig](ctx, items[protocol]); err != nil {
					errs <- fmt.Errorf("%s %v: %w", protocol, s.sig, err)
				}
			})
		}
	}
	// Every export has been rejected at least once before the state is
	// brought back: the deliveries below are retries.
	require.Eventually(t, func() bool {
		for _, protocol := range protocols {
			for _, s := range e2eSignals {
				if env.requests(t, protocol, s.sig, "denied", "open") == 0 {
					return false
				}
			}
		}
		return true
	}, e2eWait, time.Millisecond, "not every export was rejected")
	for _, s := range e2eSignals {
		require.Zero(t, s.received(env))
	}

	env.setLevel(t, e2eCalm, decision.StateNormal)
	wg.Wait() // bounded by ctx and the exporters' max_elapsed_time
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for _, s := range e2eSignals {
		assert.Equal(t, items["http"]+items["grpc"], s.received(env), "%v items at the sink", s.sig)
		for _, protocol := range protocols {
			assert.EqualValues(t, 1, env.requests(t, protocol, s.sig, "allowed", ""), "%s %v admitted once", protocol, s.sig)
			t.Logf("%s %v: rejected %d times before delivery", protocol, s.sig, env.requests(t, protocol, s.sig, "denied", "open"))
		}
	}
}
