// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package series reads the collector's own metrics as flat series, for the
// end-to-end tests and the benchmark harness: the Prometheus text exposition
// parsed by prometheus/common's expfmt, and sums by name and labels.
package series // import "github.com/otelthrottle/throttle/testbed/internal/series"

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Sample is one series: a counter, gauge or untyped value, or one of the
// _bucket, _sum, _count and quantile series of a histogram or summary.
type Sample struct {
	Name   string
	Labels map[string]string
	Value  float64
}

// Parse parses a Prometheus text exposition (the collector's /metrics),
// ordered by name. A malformed exposition is an error: a partial scrape
// would read as counters going backwards.
func Parse(text string) ([]Sample, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("prometheus exposition: %w", err)
	}
	vector, err := expfmt.ExtractSamples(&expfmt.DecodeOptions{}, slices.Collect(maps.Values(families))...)
	if err != nil {
		return nil, fmt.Errorf("prometheus exposition: %w", err)
	}
	out := make([]Sample, 0, len(vector))
	for _, v := range vector {
		s := Sample{Name: string(v.Metric[model.MetricNameLabel]), Labels: make(map[string]string, len(v.Metric)-1), Value: float64(v.Value)}
		for k, lv := range v.Metric {
			if k != model.MetricNameLabel {
				s.Labels[string(k)] = string(lv)
			}
		}
		out = append(out, s)
	}
	slices.SortStableFunc(out, func(a, b Sample) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}

// Sum adds the values of the samples named name (or name_total: the
// collector drops the suffix by default, a user's reader may keep it) whose
// labels include every pair of want.
func Sum(samples []Sample, name string, want map[string]string) (total float64, found bool) {
	for _, s := range samples {
		if (s.Name == name || s.Name == name+"_total") && hasLabels(s, want) {
			total += s.Value
			found = true
		}
	}
	return total, found
}

// Quantile is the upper bound of the histogram bucket that holds quantile
// q of the histogram name (its name_bucket series whose labels include
// want, summed over the rest): the finest a cumulative histogram says. NaN
// without observations; +Inf when q falls in the last bucket.
func Quantile(samples []Sample, name string, want map[string]string, q float64) float64 {
	byLE := map[float64]float64{}
	for _, s := range samples {
		if s.Name != name+"_bucket" {
			continue
		}
		if le, err := strconv.ParseFloat(s.Labels["le"], 64); err == nil && hasLabels(s, want) {
			byLE[le] += s.Value
		}
	}
	les := slices.Sorted(maps.Keys(byLE))
	if len(les) == 0 || byLE[les[len(les)-1]] <= 0 {
		return math.NaN()
	}
	rank := q * byLE[les[len(les)-1]]
	for _, le := range les {
		if byLE[le] >= rank {
			return le
		}
	}
	return math.Inf(1)
}

// hasLabels reports whether s has every label pair of want.
func hasLabels(s Sample, want map[string]string) bool {
	for k, v := range want {
		if s.Labels[k] != v {
			return false
		}
	}
	return true
}
