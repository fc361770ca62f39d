// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package downstream // import "github.com/otelthrottle/throttle/internal/downstream"

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.opentelemetry.io/collector/component"

	"github.com/otelthrottle/throttle/internal/decision"
)

// DefaultEndpoint is where the collector serves its own metrics unless
// service::telemetry::metrics says otherwise (a Prometheus pull reader on
// localhost:8888).
const DefaultEndpoint = "http://localhost:8888/metrics"

// DefaultInterval is the time between two reads of the exporters' queues: a
// read is an HTTP request and a parse of every metric the collector has,
// so it runs beside the sampler's ticks, not in them.
const DefaultInterval = 250 * time.Millisecond

// Interval bounds: below 50ms the reads cost more than they tell (the
// exporters' metrics are gauges observed on each scrape); above 5s a small
// queue fills between two reads.
const (
	minInterval = 50 * time.Millisecond
	maxInterval = 5 * time.Second
)

// Config is the downstream section: the lines the fullest exporter queue
// is held to, and where its fill is read.
type Config struct {
	decision.Lines `mapstructure:",squash"`
	// Endpoint is the collector's own metrics in the Prometheus text format
	// (service::telemetry::metrics, a pull reader with a prometheus
	// exporter). Default http://localhost:8888/metrics.
	Endpoint string `mapstructure:"endpoint"`
	// Interval is the time between two reads. Default 250ms; from 50ms to
	// 5s.
	Interval time.Duration `mapstructure:"interval"`
	// Exporters are the exporters whose queues count (their component IDs,
	// e.g. otlp_grpc/backend); empty: every exporter with a sending queue.
	Exporters []string `mapstructure:"exporters"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// DefaultConfig is the downstream section's defaults: off, as it reads the
// collector's own metrics endpoint, which the service's telemetry settings
// may move or turn off. Once on, shedding starts with the fullest queue
// half full, and every throttled request is refused before it is decoded
// from 80% on, which leaves the queue a fifth of its size for the requests
// admitted before the next reads.
func DefaultConfig() Config {
	return Config{
		Lines:    decision.Lines{Enabled: false, Enter: 0.5, Exit: 0.3, Hard: 0.8, MaxShed: 1},
		Endpoint: DefaultEndpoint,
		Interval: DefaultInterval,
	}
}

// bounds: the level is a share of a queue's capacity, which never exceeds
// 1; a breach longer than 2s lets a queue fill before the throttle acts.
var bounds = decision.Bounds{
	MaxLine:   1,
	Why:       ": the downstream lines are a share of the queue's capacity (0.8 is 80%)",
	MaxBreach: 2 * time.Second,
}

var (
	errEndpoint = errors.New("endpoint must be an http:// or https:// URL of the collector's own metrics")
	errInterval = fmt.Errorf("interval must be between %v and %v", minInterval, maxInterval)
	errExporter = errors.New("exporters: each entry must be an exporter's component ID (type[/name])")
)

// Validate checks the section: the lines when enabled (disabled lines are
// not checked, as CPU's and memory's), and where and how often to read
// whether enabled or not, so that a typo there fails at start.
func (c Config) Validate() error {
	errs := []error{c.Check(bounds)}
	if c.Endpoint != "" || c.Enabled {
		if u, err := url.Parse(c.Endpoint); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs = append(errs, fmt.Errorf("%w, got %q", errEndpoint, c.Endpoint))
		}
	}
	if c.Interval < minInterval || c.Interval > maxInterval {
		errs = append(errs, fmt.Errorf("%w, got %v", errInterval, c.Interval))
	}
	for _, e := range c.Exporters {
		var id component.ID
		if err := id.UnmarshalText([]byte(e)); err != nil {
			errs = append(errs, fmt.Errorf("%w, got %q: %w", errExporter, e, err))
		}
	}
	return errors.Join(errs...)
}
