// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// CollectorConfig is a collector for StartCollector: the distribution under
// test or a stock collector, with the configuration a benchmark rendered.
type CollectorConfig struct {
	// Process is how it runs (binary, cgroup, log, restarts);
	// StartCollector sets its Args to --config ConfigPath.
	Process ProcessConfig
	// Config is written to ConfigPath, which the collector is given
	// absolute.
	Config     []byte
	ConfigPath string
	// MetricsPort is where it serves its own metrics on 127.0.0.1
	// (service::telemetry, Prometheus); StartCollector waits up to
	// ReadyTimeout for them, then scrapes them every ScrapeEvery.
	MetricsPort  int
	ReadyTimeout time.Duration
	ScrapeEvery  time.Duration
	// StopGrace is how long Stop waits after SIGTERM before SIGKILL.
	StopGrace time.Duration
}

// Collector is a running collector and the scraper of its own metrics.
type Collector struct {
	Proc       *Process
	Scraper    *Scraper
	MetricsURL string

	grace      time.Duration
	stopScrape func()
}

// StartCollector writes the configuration, starts the collector, waits
// until its metrics answer and scrapes them in the background. On error,
// what it started is stopped.
func StartCollector(ctx context.Context, cfg CollectorConfig) (*Collector, error) {
	path, err := filepath.Abs(cfg.ConfigPath)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(path, cfg.Config, 0o644); err != nil {
		return nil, err
	}
	pc := cfg.Process
	pc.Args = []string{"--config", path}
	p, err := StartProcess(pc)
	if err != nil {
		return nil, err
	}
	c := &Collector{Proc: p, MetricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", cfg.MetricsPort), grace: cfg.StopGrace}
	if err := WaitReady(ctx, c.MetricsURL, cfg.ReadyTimeout); err != nil {
		p.Stop(cfg.StopGrace)
		return nil, err
	}
	c.Scraper = NewScraper(c.MetricsURL)
	c.stopScrape = Background(func(ctx context.Context) { c.Scraper.Run(ctx, cfg.ScrapeEvery) })
	return c, nil
}

// Stop stops the scraper, then the collector: SIGTERM to its PID, SIGKILL
// after StopGrace.
func (c *Collector) Stop() { c.Terminate(c.grace) }

// Terminate stops the scraper, then the collector: SIGTERM to its PID,
// SIGKILL after grace; it returns how long the collector took to exit and
// whether it was killed (see Process.Terminate). Stop after it returns at
// once.
func (c *Collector) Terminate(grace time.Duration) (took time.Duration, killed bool) {
	c.stopScrape()
	return c.Proc.Terminate(grace)
}
