// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"context"
	"io"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/otelthrottle/throttle/testbed/internal/series"
)

// Sample is one series of the Prometheus exposition.
type Sample = series.Sample

// Sum adds the series of name (with or without a _total suffix) whose labels
// include want; found is false when there is none.
func Sum(samples []Sample, name string, want map[string]string) (total float64, found bool) {
	return series.Sum(samples, name, want)
}

// Value is Sum's total, or NaN (a missing value, never 0) when there is
// no such series.
func Value(samples []Sample, name string, want map[string]string) float64 {
	if v, ok := Sum(samples, name, want); ok {
		return v
	}
	return math.NaN()
}

// Scraper fetches the collector's metrics in the background, so that a slow
// answer from an overloaded collector never delays the 250 ms sampling.
type Scraper struct {
	url    string
	client *http.Client

	mu      sync.Mutex
	latest  []Sample
	at      time.Time
	lastErr error
}

func NewScraper(url string) *Scraper {
	return &Scraper{url: url, client: &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1}}}
}

func (s *Scraper) Run(ctx context.Context, every time.Duration) {
	defer s.client.CloseIdleConnections()
	Every(ctx, every, func() { s.once(ctx) })
}

func (s *Scraper) once(ctx context.Context) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.url, http.NoBody)
	resp, err := s.client.Do(req)
	if err != nil {
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
		return
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		return
	}
	parsed, err := series.Parse(string(body))
	if err != nil {
		s.mu.Lock()
		s.lastErr = err
		s.mu.Unlock()
		return
	}
	s.mu.Lock()
	s.latest, s.at, s.lastErr = parsed, time.Now(), nil
	s.mu.Unlock()
}

// Get returns the latest scrape and its time.
func (s *Scraper) Get() ([]Sample, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest, s.at
}
