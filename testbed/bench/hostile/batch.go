// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// batchClient is an honest agent beside the hostile peer, from an address
// of its own (batchAddr): it sends traces of one size over OTLP/HTTP
// (gzip), one request at a time, the next every cycle or as soon as the
// last is answered if that took longer, never retried. Some findings are
// about what a hostile peer does to batches of a given size (larger than
// a peer's share of the budget, or of an ordinary size) rather than to
// the normal clients' load.
type batchClient struct {
	url     string
	body    []byte
	items   int
	decoded int
	cycle   time.Duration
	timeout time.Duration
	start   time.Time
	httpC   *http.Client

	mu      sync.Mutex
	answers []answer
}

// sizedPayload returns an OTLP request of signal of at least decoded bytes
// (before any gzip, which gz asks for), of items like the normal clients'
// (attrSize bytes of attribute each).
func sizedPayload(signal loadgen.Signal, decoded, attrSize int, gz bool) (*loadgen.Payload, error) {
	probe, err := loadgen.BuildPayload(signal, 100, attrSize, loadgen.Proto, false)
	if err != nil {
		return nil, err
	}
	items := itemsFor(decoded, probe.RawSize, probe.Items)
	for {
		p, err := loadgen.BuildPayload(signal, items, attrSize, loadgen.Proto, gz)
		if err != nil || p.RawSize >= decoded {
			return p, err
		}
		items += max(items/100, 1)
	}
}

// batchPayload is the honest batch client's request: gzip'd traces of
// decoded bytes.
func batchPayload(decoded, attrSize int) (*loadgen.Payload, error) {
	return sizedPayload(loadgen.Traces, decoded, attrSize, true)
}

// itemsFor is how many items make a request of decoded bytes, from a
// probe of probeItems items that was probeSize bytes: at least one, and
// rounded up.
func itemsFor(decoded, probeSize, probeItems int) int {
	if probeSize <= 0 || probeItems <= 0 {
		return 1
	}
	return max((decoded*probeItems+probeSize-1)/probeSize, 1)
}

func newBatchClient(url string, p *loadgen.Payload, cycle, timeout time.Duration, start time.Time) *batchClient {
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(batchAddr, 0)), Timeout: 5 * time.Second}
	return &batchClient{
		url: url, body: p.Body, items: p.Items, decoded: p.RawSize, cycle: cycle, timeout: timeout, start: start,
		httpC: &http.Client{Transport: &http.Transport{Proxy: nil, DialContext: d.DialContext, MaxIdleConnsPerHost: 1, DisableCompression: true}},
	}
}

// kind names the client's requests in answers.csv.
func (b *batchClient) kind() string { return "batch-" + sizeName(b.decoded) }

// sizeName is n bytes in MiB or KiB, whichever is whole enough.
func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%.0fMiB", float64(n)/(1<<20))
	}
	return fmt.Sprintf("%.0fKiB", float64(n)/(1<<10))
}

// run sends until ctx ends; the request in flight then is answered (the
// run's context, parent, bounds it) and recorded.
func (b *batchClient) run(ctx, parent context.Context) {
	defer b.httpC.CloseIdleConnections()
	for ctx.Err() == nil {
		sent := time.Since(b.start)
		a := answer{who: b.kind(), sent: sent}
		rctx, cancel := context.WithTimeout(parent, b.timeout)
		a.class, a.message = b.send(rctx)
		cancel()
		a.done = time.Since(b.start)
		if a.class == classOK {
			a.items = b.items
		}
		b.mu.Lock()
		b.answers = append(b.answers, a)
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(sent + b.cycle - time.Since(b.start)):
		}
	}
}

func (b *batchClient) send(ctx context.Context) (class, string) {
	return postOTLP(ctx, b.httpC, b.url+"/v1/traces", b.body)
}

func (b *batchClient) snapshot() []answer {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]answer(nil), b.answers...)
}
