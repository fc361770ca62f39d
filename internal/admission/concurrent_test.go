// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// TestConcurrentSmallCallsOfOneClient: a client's second gRPC call is
// admitted while its first, a small message already decoded, is still
// being handled by the pipeline, when the budget holds both. With the
// default share and grpc_max_message_size, an 8 MiB budget (the "auto" one
// of a 100 MiB container) gives the client a 4 MiB limit, which is what a
// call reserves before its message is read: the second call must not wait
// for the first to leave the pipeline.
func TestConcurrentSmallCallsOfOneClient(t *testing.T) {
	const budget = 8 << 20
	cfg := NewDefaultConfig()
	cfg.MaxInflightBytes = FixedInflightBudget(budget)
	c, err := New(cfg, NewDefaultHoldConfig(), Settings{Decider: exemptDecider{}, Budget: budget})
	require.NoError(t, err)
	t.Cleanup(c.Close)
	req := Request{Protocol: ProtocolGRPC, Signal: decision.SignalTraces, Remote: netip.MustParseAddr("127.0.0.1"), Length: -1}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()

	first, v := c.Admit(ctx, req)
	require.Equal(t, decision.VerdictAdmit, v)
	require.Equal(t, decision.VerdictAdmit, first.Start(ctx, nil, false))
	first.Decoded(200, 200) // a small message, now in the pipeline
	defer first.Release(true)

	second, v := c.Admit(ctx, req)
	require.Equal(t, decision.VerdictAdmit, v)
	start := time.Now()
	v = second.Start(ctx, nil, false)
	assert.Equal(t, decision.VerdictAdmit, v, "the second call was refused after %v; reserved %d of %d",
		time.Since(start), c.Stats().Reserved, c.Stats().Budget)
	second.Release(false)
}
