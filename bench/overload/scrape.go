package main

import (
	"context"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/otelthrottle/throttle/internal/promtext"
)

// sample is one series of the Prometheus exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseExposition parses the Prometheus text format into the harness's
// samples.
func parseExposition(text string) []sample {
	parsed := promtext.Parse(text)
	out := make([]sample, len(parsed))
	for i, p := range parsed {
		out[i] = sample{name: p.Name, labels: p.Labels, value: p.Value}
	}
	return out
}

// sum adds the series of name (with or without a _total suffix) whose labels
// include want; found is false when there is none.
func sum(samples []sample, name string, want map[string]string) (total float64, found bool) {
next:
	for _, s := range samples {
		if s.name != name && s.name != name+"_total" {
			continue
		}
		for k, v := range want {
			if s.labels[k] != v {
				continue next
			}
		}
		total += s.value
		found = true
	}
	return total, found
}

// scraper fetches the collector's metrics in the background, so that a slow
// answer from an overloaded collector never delays the 250 ms sampling.
type scraper struct {
	url    string
	client *http.Client

	mu      sync.Mutex
	latest  []sample
	at      time.Time
	lastErr error
}

func newScraper(url string) *scraper {
	return &scraper{url: url, client: &http.Client{Timeout: time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1}}}
}

func (s *scraper) run(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	defer s.client.CloseIdleConnections()
	for {
		s.once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *scraper) once(ctx context.Context) {
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
	parsed := parseExposition(string(body))
	s.mu.Lock()
	s.latest, s.at, s.lastErr = parsed, time.Now(), nil
	s.mu.Unlock()
}

// get returns the latest scrape and its time.
func (s *scraper) get() ([]sample, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.latest, s.at
}
