// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// GoroutineEvery is how often the harness reads the collector's goroutine
// count from the pprof extension (when the config enables it, -pprof): a
// debug=1 goroutine profile stops the world briefly and formats every
// stack, so it is read far less often than the metrics.
const GoroutineEvery = 5 * time.Second

// GoroutineScraper reads GET /debug/pprof/goroutine?debug=1 of the
// collector's pprof extension in the background and keeps the total of the
// first line ("goroutine profile: total N"). The collector (v0.165.0)
// exposes no goroutine metric, hence pprof.
type GoroutineScraper struct {
	url    string
	client *http.Client

	mu      sync.Mutex
	latest  float64
	at      time.Time
	lastErr error
}

func NewGoroutineScraper(pprofPort int) *GoroutineScraper {
	return &GoroutineScraper{
		url:    fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/goroutine?debug=1", pprofPort),
		client: &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 1}},
	}
}

func (g *GoroutineScraper) Run(ctx context.Context, every time.Duration) {
	defer g.client.CloseIdleConnections()
	Every(ctx, every, func() { g.once(ctx) })
}

func (g *GoroutineScraper) once(ctx context.Context) {
	n, err := g.fetch(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	if err != nil {
		g.lastErr = err
		return
	}
	g.latest, g.at, g.lastErr = float64(n), time.Now(), nil
}

func (g *GoroutineScraper) fetch(ctx context.Context) (int, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, g.url, http.NoBody)
	resp, err := g.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	// Drain (bounded) so that the connection is reused.
	defer func() { _, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 16<<20)) }()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", g.url, resp.Status)
	}
	return parseGoroutineTotal(resp.Body)
}

// Get returns the latest goroutine count and when it was read (zero time:
// never).
func (g *GoroutineScraper) Get() (float64, time.Time) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.latest, g.at
}

// parseGoroutineTotal reads the first line of a debug=1 goroutine profile
// of net/http/pprof, "goroutine profile: total N", and returns N.
func parseGoroutineTotal(r io.Reader) (int, error) {
	line, err := bufio.NewReaderSize(io.LimitReader(r, 4096), 256).ReadString('\n')
	if err != nil && (!errors.Is(err, io.EOF) || line == "") {
		return 0, fmt.Errorf("goroutine profile: reading the first line: %w", err)
	}
	const prefix = "goroutine profile: total "
	v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), prefix)
	if !ok {
		return 0, fmt.Errorf("goroutine profile: first line %q, want %q", trunc(line, 80), prefix+"N")
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n < 0 {
		return 0, fmt.Errorf("goroutine profile: bad total in %q", trunc(line, 80))
	}
	return n, nil
}

func trunc(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
