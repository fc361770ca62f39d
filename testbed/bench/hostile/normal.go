// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// normalAddr is the normal clients' address, hostileAddr the hostile
// peer's: the gateway counts its per-peer share by remote address.
var (
	normalAddr  = netip.MustParseAddr("127.0.0.1")
	hostileAddr = netip.MustParseAddr("127.0.0.2")
	// batchAddr is the honest batch client's (batch.go), apart from the
	// attacker addresses hostileAddr and up (attackerAddr).
	batchAddr = netip.MustParseAddr("127.0.1.1")
)

// maxAttackers is how many attacker addresses attackerAddr gives.
const maxAttackers = 250

// attackerAddr is the i-th attacker address: 127.0.0.2 (hostileAddr) for
// 0, then 127.0.0.3 and up.
func attackerAddr(i int) netip.Addr {
	a := hostileAddr.As4()
	a[3] += byte(min(max(i, 0), maxAttackers-1))
	return netip.AddrFrom4(a)
}

// normalConfig describes the normal clients: agents sending traces to the
// gateway over OTLP/HTTP (gzip, as the otlp_http exporter sends by default)
// and over gRPC (gzip too), each request answered, never retried, so that
// every answer is seen as the gateway gave it.
type normalConfig struct {
	httpTarget, grpcTarget string
	// items per request and the size of each item's big attribute.
	items, attrSize int
	// timeout of one request: the OTLP exporters' default.
	timeout time.Duration
	// maxInflight per protocol in open loop: a request due beyond it is
	// not sent and counted as skipped.
	maxInflight int
	grpcConns   int
}

// normalClients sends the normal load and records every answer.
type normalClients struct {
	cfg    normalConfig
	start  time.Time
	body   []byte // the gzip'd OTLP/HTTP body
	items  int
	httpC  *http.Client
	conns  []*grpc.ClientConn
	pm     *grpc.PreparedMsg
	next   atomic.Uint64
	counts [numClasses]atomic.Int64
	// skipped: due in open loop while maxInflight were in flight.
	skipped  atomic.Int64
	accepted atomic.Int64 // items

	mu      sync.Mutex
	answers []answer
}

func newNormalClients(ctx context.Context, cfg normalConfig, start time.Time) (*normalClients, error) {
	p, err := loadgen.BuildPayload(loadgen.Traces, cfg.items, cfg.attrSize, loadgen.Proto, true)
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(normalAddr, 0)), Timeout: 5 * time.Second}
	n := &normalClients{
		cfg: cfg, start: start, body: p.Body, items: p.Items,
		httpC: &http.Client{
			Transport: &http.Transport{
				Proxy: nil, DialContext: d.DialContext,
				MaxIdleConns: cfg.maxInflight, MaxIdleConnsPerHost: cfg.maxInflight,
				IdleConnTimeout: 90 * time.Second, DisableCompression: true,
			},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
	}
	for range max(cfg.grpcConns, 1) {
		c, err := dialGRPC(normalAddr, cfg.grpcTarget)
		if err != nil {
			n.close()
			return nil, err
		}
		n.conns = append(n.conns, c)
	}
	if n.pm, err = prepare(ctx, n.conns[0], p.Proto); err != nil {
		n.close()
		return nil, fmt.Errorf("preparing the normal gRPC message: %w", err)
	}
	return n, nil
}

func (n *normalClients) close() {
	n.httpC.CloseIdleConnections()
	for _, c := range n.conns {
		_ = c.Close()
	}
}

// bodySizes are the normal request's sizes on the wire and decoded, for the
// report.
func (n *normalClients) bodySizes() (wire, decoded int) {
	p, _ := loadgen.BuildPayload(loadgen.Traces, n.cfg.items, n.cfg.attrSize, loadgen.Proto, false)
	return len(n.body), len(p.Body)
}

func (n *normalClients) since() time.Duration { return time.Since(n.start) }

// one sends one request of proto ("http" or "grpc") and records its answer.
func (n *normalClients) one(ctx context.Context, proto string) {
	a := answer{who: proto, sent: n.since()}
	rctx, cancel := context.WithTimeout(ctx, n.cfg.timeout)
	if proto == "http" {
		a.class, a.message = n.sendHTTP(rctx)
	} else {
		conn := n.conns[n.next.Add(1)%uint64(len(n.conns))]
		err := callPrepared(rctx, conn, n.pm)
		a.class, a.message = classifyGRPC(err, rctx.Err() != nil)
	}
	cancel()
	a.done = n.since()
	if a.class == classOK {
		a.items = n.items
	}
	n.record(a)
}

func (n *normalClients) record(a answer) {
	n.counts[a.class].Add(1)
	n.accepted.Add(int64(a.items))
	n.mu.Lock()
	n.answers = append(n.answers, a)
	n.mu.Unlock()
}

func (n *normalClients) sendHTTP(ctx context.Context) (class, string) {
	return postOTLP(ctx, n.httpC, n.cfg.httpTarget+"/v1/traces", n.body)
}

// postOTLP posts a gzip'd OTLP/HTTP body to url with c and returns the
// class of the answer and, for a refusal, its message; no answer within
// ctx is an error.
func postOTLP(ctx context.Context, c *http.Client, url string, gzipped []byte) (class, string) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(gzipped))
	if err != nil {
		return classError, err.Error()
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("Content-Encoding", "gzip")
	resp, err := c.Do(req)
	if err != nil {
		return classError, shorten(err.Error(), 200)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		return classError, shorten(err.Error(), 200)
	}
	return classifyHTTP(resp.StatusCode, body, resp.Header.Get("Content-Type"))
}

// openLoop sends rate requests per second of proto until ctx ends, at most
// maxInflight at once, and waits for the last answers.
func (n *normalClients) openLoop(ctx context.Context, proto string, rate float64) {
	if rate <= 0 {
		return
	}
	sem := make(chan struct{}, n.cfg.maxInflight)
	var wg sync.WaitGroup
	defer wg.Wait()
	// The run's context bounds the requests in flight; ctx only stops
	// issuing, so that the last ones are answered and counted.
	reqCtx := context.WithoutCancel(ctx)
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	for issued := 0; ; issued++ {
		due := start.Add(time.Duration(issued) * interval)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(due)):
		}
		select {
		case sem <- struct{}{}:
			wg.Go(func() {
				defer func() { <-sem }()
				n.one(reqCtx, proto)
			})
		default:
			n.skipped.Add(1)
			n.record(answer{who: proto, sent: n.since(), done: n.since(), class: classError, message: "skipped: max in flight"})
		}
	}
}

// closedLoop keeps c requests of proto in flight until ctx ends: the
// capacity measurement.
func (n *normalClients) closedLoop(ctx context.Context, proto string, c int) {
	var wg sync.WaitGroup
	reqCtx := context.WithoutCancel(ctx)
	for range c {
		wg.Go(func() {
			for ctx.Err() == nil {
				n.one(reqCtx, proto)
			}
		})
	}
	wg.Wait()
}

// snapshot returns the answers so far, and the counts by class.
func (n *normalClients) snapshot() []answer {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]answer(nil), n.answers...)
}
