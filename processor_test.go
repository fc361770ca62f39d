// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleprocessor

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/consumer/consumererror"
	"go.opentelemetry.io/otel/sdk/metric/metricdata/metricdatatest"
	"google.golang.org/grpc/codes"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/metadatatest"
)

func TestStartFindsExtension(t *testing.T) {
	edge := component.MustNewIDWithName("throttle", "edge")
	tests := []struct {
		name    string
		host    component.Host
		wantErr string
	}{
		{
			name:    "missing",
			host:    componenttest.NewNopHost(),
			wantErr: `throttle processor: extension "throttle/edge" not found; add it under extensions: and list it in service.extensions`,
		},
		{
			name:    "other ID",
			host:    hostWith(component.MustNewID("throttle"), newFakeThrottle(0)),
			wantErr: `throttle processor: extension "throttle/edge" not found; add it under extensions: and list it in service.extensions`,
		},
		{
			name:    "wrong type",
			host:    hostWith(edge, notThrottle{}),
			wantErr: `throttle processor: extension "throttle/edge" is a throttleprocessor.notThrottle, not a throttle extension; set the processor's extension: to the ID of a throttle extension`,
		},
		{
			name: "found",
			host: hostWith(edge, newFakeThrottle(0)),
		},
	}
	for _, tt := range tests {
		for _, h := range signalHarnesses {
			t.Run(tt.name+"/"+h.signal.String(), func(t *testing.T) {
				cfg := &Config{Extension: edge, OnReject: OnRejectRefuse}
				c, _, _ := h.create(t, metadatatest.NewSettings(componenttest.NewTelemetry()), cfg)
				err := c.Start(context.Background(), tt.host)
				if tt.wantErr == "" {
					require.NoError(t, err)
				} else {
					require.EqualError(t, err, tt.wantErr)
				}
				require.NoError(t, c.Shutdown(context.Background()))
			})
		}
	}
}

func TestProcessorDecisions(t *testing.T) {
	const delay = 7 * time.Second
	for _, h := range signalHarnesses {
		t.Run(h.signal.String(), func(t *testing.T) {
			for _, onReject := range []OnReject{OnRejectRefuse, OnRejectDrop} {
				t.Run(string(onReject), func(t *testing.T) {
					tel := componenttest.NewTelemetry()
					t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
					fake := newFakeThrottle(delay)
					cfg := &Config{Extension: defaultExtensionID, OnReject: onReject}
					c, send, received := h.create(t, metadatatest.NewSettings(tel), cfg)
					require.NoError(t, c.Start(context.Background(), hostWith(defaultExtensionID, fake)))
					t.Cleanup(func() { require.NoError(t, c.Shutdown(context.Background())) })

					// Normal: 2 batches pass.
					require.NoError(t, send(context.Background(), 3))
					require.NoError(t, send(context.Background(), 4))
					assert.Equal(t, 7, received())

					// Open: 5 items rejected.
					fake.set(h.signal, decision.VerdictDenyOpen)
					errOpen := send(context.Background(), 5)
					// Shedding, and the draw fell under p_drop: 6 items rejected.
					fake.set(h.signal, decision.VerdictDenyShed)
					errShed := send(context.Background(), 6)
					assert.Equal(t, 7, received(), "a rejected batch must not reach the next consumer")

					// Back to Normal.
					fake.set(h.signal, decision.VerdictAdmit)
					require.NoError(t, send(context.Background(), 1))
					assert.Equal(t, 8, received())

					rejected := "refused"
					if onReject == OnRejectDrop {
						rejected = "dropped"
						assert.NoError(t, errOpen)
						assert.NoError(t, errShed)
					} else {
						for _, err := range []error{errOpen, errShed} {
							code, d := e2edata.RetryInfo(t, err)
							assert.Equal(t, codes.ResourceExhausted, code)
							assert.Equal(t, delay, d)
							assert.False(t, consumererror.IsPermanent(err), "a refusal must be retryable")
						}
						assert.Contains(t, errOpen.Error(), h.signal.String()+" refused by the throttle processor")
						assert.Contains(t, errOpen.Error(), "(open)")
						assert.Contains(t, errShed.Error(), "(shed)")
					}

					// One decision per batch, for this signal only, each recorded.
					for s := range decision.NumSignals {
						want := int64(0)
						if s == h.signal {
							want = 5
						}
						assert.Equal(t, want, fake.decides[s].Load(), "decisions for %v", s)
					}
					assert.Equal(t, []recorded{
						{Signal: h.signal, Verdict: decision.VerdictAdmit},
						{Signal: h.signal, Verdict: decision.VerdictAdmit},
						{Signal: h.signal, Verdict: decision.VerdictDenyOpen},
						{Signal: h.signal, Verdict: decision.VerdictDenyShed},
						{Signal: h.signal, Verdict: decision.VerdictAdmit},
					}, fake.recordedDecisions())

					metadatatest.AssertEqualProcessorThrottleItems(t, tel,
						outcomePoints(h.signal, map[string]int64{"passed": 8, rejected: 11}),
						metricdatatest.IgnoreTimestamp())
					metadatatest.AssertEqualProcessorThrottleBatches(t, tel,
						outcomePoints(h.signal, map[string]int64{"passed": 3, rejected: 2}),
						metricdatatest.IgnoreTimestamp())
				})
			}
		})
	}
}

// TestRefusalSurvivesWrapping checks that the status reaches the receiver
// through the wrappers the service puts around errors on the way back
// (consumererror.NewDownstream in its pipeline instrumentation, or any %w).
func TestRefusalSurvivesWrapping(t *testing.T) {
	fake := newFakeThrottle(1500 * time.Millisecond)
	fake.set(decision.SignalLogs, decision.VerdictDenyOpen)
	c, send, _ := signalHarnesses[decision.SignalLogs].create(t,
		metadatatest.NewSettings(componenttest.NewTelemetry()), createDefaultConfig())
	require.NoError(t, c.Start(context.Background(), hostWith(defaultExtensionID, fake)))
	defer func() { require.NoError(t, c.Shutdown(context.Background())) }()
	err := send(context.Background(), 1)
	require.Error(t, err)

	for name, wrapped := range map[string]error{
		"plain":      err,
		"downstream": consumererror.NewDownstream(err),
		"fmt":        fmt.Errorf("pipeline: %w", consumererror.NewDownstream(err)),
		"joined":     errors.Join(err),
	} {
		t.Run(name, func(t *testing.T) {
			code, d := e2edata.RetryInfo(t, wrapped)
			assert.Equal(t, codes.ResourceExhausted, code)
			assert.Equal(t, 1500*time.Millisecond, d)
			assert.False(t, consumererror.IsPermanent(wrapped))
		})
	}
}

func TestShutdownWithoutStart(t *testing.T) {
	for _, h := range signalHarnesses {
		t.Run(h.signal.String(), func(t *testing.T) {
			c, _, _ := h.create(t, metadatatest.NewSettings(componenttest.NewTelemetry()), createDefaultConfig())
			require.NoError(t, c.Shutdown(context.Background()))
		})
	}
}
