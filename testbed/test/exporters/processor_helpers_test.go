// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package exporters

// Helpers of processor_test.go: the expected data points of the
// processor's counters.

import (
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/otelthrottle/throttle/internal/decision"
)

// outcomeNames are the values of the processor counters' outcome attribute.
var outcomeNames = []string{"passed", "refused", "dropped"}

// outcomePoints are the expected data points of one processor's counters.
func outcomePoints(sig decision.Signal, values map[string]int64) []metricdata.DataPoint[int64] {
	var dps []metricdata.DataPoint[int64]
	for _, o := range outcomeNames {
		v, ok := values[o]
		if !ok {
			continue
		}
		dps = append(dps, metricdata.DataPoint[int64]{
			Attributes: attribute.NewSet(
				attribute.String("processor", "throttle"),
				attribute.String("signal", sig.String()),
				attribute.String("outcome", o),
			),
			Value: v,
		})
	}
	return dps
}
