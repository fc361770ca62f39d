// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission

import (
	"bytes"
	"context"
	"io"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/decision"
)

// exemptDecider admits everything and exempts the signals it lists.
type exemptDecider map[decision.Signal]bool

func (exemptDecider) Pressure(decision.Signal) (bool, float64) { return false, 0 }
func (d exemptDecider) Exempt(s decision.Signal) bool          { return d[s] }
func (exemptDecider) Pressed(decision.Signal) bool             { return false }
func (exemptDecider) Holdable(decision.Signal) bool            { return true }

// TestNonExemptAloneFitsBesideTheExemptReserve: with a signal exempt, a
// request of another signal that is alone in the budget is admitted
// whatever its key may hold (share 1 here): what it reserves first never
// asks for more than the three quarters of the budget it may ever take.
func TestNonExemptAloneFitsBesideTheExemptReserve(t *testing.T) {
	const budget = 64 << 10
	newController := func(t *testing.T, unknown ByteSize) *Controller {
		cfg := NewDefaultConfig()
		cfg.MaxInflightBytes = FixedInflightBudget(budget)
		cfg.UnknownSize = unknown
		cfg.Fairness.Share = 1
		c, err := New(cfg, HoldConfig{}, Settings{
			Decider: exemptDecider{decision.SignalMetrics: true},
			Budget:  budget,
		})
		require.NoError(t, err)
		t.Cleanup(c.Close)
		return c
	}
	remote := netip.MustParseAddr("127.0.0.1")

	t.Run("grpc call", func(t *testing.T) {
		c := newController(t, 16<<10)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tk, v := c.Admit(ctx, Request{Protocol: ProtocolGRPC, Signal: decision.SignalTraces, Remote: remote, Length: -1})
		require.Equal(t, decision.VerdictAdmit, v)
		start := time.Now()
		v = tk.Start(ctx, nil, false)
		assert.Equal(t, decision.VerdictAdmit, v, "refused after %v with nothing else in the budget", time.Since(start))
		assert.LessOrEqual(t, c.Stats().Reserved, int64(budget*3/4))
		tk.Release(true)
	})

	t.Run("grpc call, unknown_size the whole budget", func(t *testing.T) {
		c := newController(t, budget)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tk, v := c.Admit(ctx, Request{Protocol: ProtocolGRPC, Signal: decision.SignalTraces, Remote: remote, Length: -1})
		require.Equal(t, decision.VerdictAdmit, v, "refused at the tap with nothing else in the budget")
		assert.Equal(t, decision.VerdictAdmit, tk.Start(ctx, nil, false))
		tk.Release(true)
	})

	t.Run("http body, unknown_size the whole budget", func(t *testing.T) {
		c := newController(t, budget)
		tk, v := c.Admit(context.Background(), Request{Protocol: ProtocolHTTP, Signal: decision.SignalTraces, Remote: remote, Length: -1})
		require.Equal(t, decision.VerdictAdmit, v)
		tk.Start(context.Background(), nil, false)
		body := bytes.NewReader(make([]byte, 8<<10))
		buf := make([]byte, 4<<10)
		var err error
		for err == nil {
			_, err = tk.Read(body, buf)
		}
		require.ErrorIs(t, err, io.EOF, "the first byte of a body alone in the budget was refused")
		tk.Release(true)
	})
}
