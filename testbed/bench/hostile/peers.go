// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

// The scenarios: one hostile peer each (scenarioBaseline has none).
const (
	scenarioBaseline      = "baseline"
	scenarioTrickle       = "fill-then-trickle"
	scenarioGzipBomb      = "oversize-gzip"
	scenarioBigLength     = "oversize-length"
	scenarioGRPCInflate   = "grpc-inflated-message"
	scenarioHoldFlood     = "hold-flood"
	scenarioSilentStreams = "silent-streams"
	// The findings of a later review (setups.go): each has a target of
	// its own rather than the criteria above.
	scenarioGRPCShrink        = "grpc-shrink"
	scenarioGRPCShrinkControl = "grpc-shrink-control"
	scenarioLaneTrickle       = "lane-trickle"
	scenarioSilentAddresses   = "silent-addresses"
	scenarioShutdown          = "shutdown"
	scenarioLaneLift          = "lane-allowance-lift"
	scenarioExemptOverdraft   = "exempt-overdraft"
)

// peerScenarios are the scenarios of one hostile peer held to the
// criteria of check, findingScenarios those of the later findings, each
// with a target of its own (setups.go).
var (
	peerScenarios = []string{
		scenarioTrickle, scenarioGzipBomb, scenarioBigLength, scenarioGRPCInflate, scenarioHoldFlood, scenarioSilentStreams,
	}
	findingScenarios = []string{
		scenarioGRPCShrink, scenarioGRPCShrinkControl, scenarioLaneTrickle, scenarioSilentAddresses, scenarioShutdown,
		scenarioLaneLift, scenarioExemptOverdraft,
	}
)

// hostileScenarios are the hostile scenarios in their default order.
var hostileScenarios = append(append([]string(nil), peerScenarios...), findingScenarios...)

// scenarioDescriptions say what each hostile peer does, for the report.
var scenarioDescriptions = map[string]string{
	scenarioBaseline:      "no hostile peer",
	scenarioTrickle:       "one gzip body that decompresses to -trickle-mib MiB (chunked, flushed), then one flushed byte every -trickle-every on the same connection; a new connection as soon as the gateway ends one",
	scenarioGzipBomb:      "back-to-back gzip'd OTLP bodies of some KiB that decompress to each of -bomb-mib MiB in turn (valid OTLP up to the receiver's 20 MiB limit), on -bomb-lanes connections",
	scenarioBigLength:     "a chain of uncompressed OTLP bodies whose Content-Length is -length-factor times the admission budget, each sent at -length-rate MiB/s, the next as soon as one is answered",
	scenarioGRPCInflate:   "gRPC Export calls of one gzip'd message of about 4 KiB that decodes to -inflate-bytes (an unknown field of zeros), -inflate-rate calls per second",
	scenarioHoldFlood:     "-flood-http HTTP requests that send their headers (Content-Length of a normal body) and hold the body back, and -flood-grpc gRPC streams that send their headers and hold the message back, each reopened when the gateway ends it",
	scenarioSilentStreams: "-silent-streams gRPC Export streams that open and never send a message, each reopened as soon as the gateway cancels it",

	scenarioGRPCShrink: "waves of -shrink-calls concurrent gRPC Exports, on -shrink-conns connections, each of one gzip'd span whose attribute is -inflate-bytes of letters; " +
		"each wave after one accepted empty Export (which teaches the gateway the peer's message size: its calls then reserve the 4 KiB floor while grpc-go decompresses and decodes them); " +
		"every call of a wave is opened (its headers sent, its reservation made) before their messages go out; a wave every -shrink-every",
	scenarioGRPCShrinkControl: "the waves of " + scenarioGRPCShrink + " without the empty Export first: what the same calls do when their peer's size is not shrunk",
	scenarioLaneTrickle: "one chunked gzip body of zeros that decompresses to -lane-mib MiB: the first -lane-head-mib MiB at once (its reservation reaches its share, it takes the oversize lane), " +
		"the rest at -lane-rate bytes/s on the wire, which decompress to about a thousand times as many, enough progress for the minimum body rate; a new connection when the gateway ends one",
	scenarioSilentAddresses: "-silent-addresses addresses (127.0.0.2 on), each with -silent-conns chunked HTTP requests that send their headers and no body byte, each sent again when the gateway ends it",
	scenarioShutdown: "the " + scenarioLaneTrickle + " body, and after it -shutdown-streams gRPC Exports with a deadline of -shutdown-deadline that wait for bytes (their peer's share is the trickling body's); " +
		"-shutdown-after into the load phase the gateway gets a SIGTERM and is killed if it has not exited after -shutdown-grace",
	scenarioLaneLift: "the " + scenarioGzipBomb + " peer, and beside it a second address (127.0.0.3) with -lift-conns chunked requests that send their headers and close the connection: " +
		"each reserved and never read body counts as read by the others, what the oversize lane's allowance is a share of",
	scenarioExemptOverdraft: "metrics exempt in the gateway (rules: metrics enabled: false); -exempt-addresses addresses (127.0.0.2 on), each with -exempt-conns connections sending uncompressed " +
		"metrics bodies of -exempt-kib KiB back to back, admitted past the full budget by the exempt overdraft",
}

// minCycle is the least time between two requests of one lane of the
// hostile peer: a request the gateway refuses at once is sent again after
// this, not in a tight loop (a flood of requests is what shedding is for,
// not what these scenarios test). A request the gateway held longer is
// reopened at once.
const minCycle = 100 * time.Millisecond

// peer records the hostile peer's requests.
type peer struct {
	start  time.Time
	counts [numClasses]atomic.Int64
	sent   atomic.Int64
	open   atomic.Int64 // unanswered now

	mu   sync.Mutex
	reqs []answer
}

func newPeer(start time.Time) *peer { return &peer{start: start} }

// hreq is one request of the hostile peer.
type hreq struct {
	p    *peer
	a    answer
	once sync.Once
}

func (p *peer) begin(kind string) *hreq {
	p.sent.Add(1)
	p.open.Add(1)
	return &hreq{p: p, a: answer{who: kind, sent: time.Since(p.start)}}
}

// end records what became of the request (once).
func (r *hreq) end(c class, msg string) {
	r.once.Do(func() {
		r.a.done, r.a.class, r.a.message = time.Since(r.p.start), c, msg
		r.p.open.Add(-1)
		r.p.counts[c].Add(1)
		r.p.mu.Lock()
		r.p.reqs = append(r.p.reqs, r.a)
		r.p.mu.Unlock()
	})
}

// held records a request still unanswered when the round ended.
func (r *hreq) held() { r.end(classHeld, "held until the end of the round") }

// lifetime is how long the request has been out.
func (r *hreq) lifetime() time.Duration { return time.Since(r.p.start) - r.a.sent }

func (p *peer) snapshot() []answer {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]answer(nil), p.reqs...)
}

// peerEnv is what a hostile peer needs to know of the round.
type peerEnv struct {
	o        *options
	peer     *peer
	httpAddr string // 127.0.0.1:port
	grpcAddr string
	// budget is the gateway's admission budget in bytes.
	budget int64
	// normalDecoded is a normal request's decoded size.
	normalDecoded int
	payloads      *hostilePayloads
}

// hostilePayloads are the hostile bodies, built once per run.
type hostilePayloads struct {
	trickle  *trickleStream
	bombs    [][]byte
	bombMiB  []int
	inflated []byte
	// inflatedWire is the inflated message's size gzip'd.
	inflatedWire int

	// lane is the lane-trickle body; batches the honest batch clients'
	// requests by decoded size; small a small OTLP traces message;
	// exemptBody the exempt-overdraft's uncompressed metrics body.
	lane *laneStream
	// shrink is the grpc-shrink calls' message, shrinkWire its size
	// gzip'd.
	shrink     []byte
	shrinkWire int
	batches    map[int]*loadgen.Payload
	small      []byte
	exemptBody *loadgen.Payload
}

func buildPayloads(o *options) (*hostilePayloads, error) {
	hp := &hostilePayloads{}
	var err error
	// A piece every -trickle-every for the longest a connection can last.
	pieces := int((o.warmup+o.duration)/max(o.trickleEvery, time.Second)) + 2
	if hp.trickle, err = buildTrickle(o.trickleMiB<<20, pieces); err != nil {
		return nil, err
	}
	for _, mib := range o.bombMiB {
		b, err := gzipBlobRequest(mib << 20)
		if err != nil {
			return nil, err
		}
		hp.bombs = append(hp.bombs, b)
		hp.bombMiB = append(hp.bombMiB, mib)
	}
	hp.inflated = inflatedMessage(o.inflateBytes)
	hp.inflatedWire = gzipSize(hp.inflated)
	hp.shrink = blobMessage(o.inflateBytes)
	hp.shrinkWire = gzipSize(hp.shrink)
	if hp.lane, err = buildLaneStream(o.laneMiB<<20, o.laneHeadMiB<<20); err != nil {
		return nil, err
	}
	hp.batches = map[int]*loadgen.Payload{}
	for _, sc := range o.scenarios {
		if n := setupFor(o, sc).batchBytes; n > 0 && hp.batches[n] == nil {
			if hp.batches[n], err = batchPayload(n, o.attrSize); err != nil {
				return nil, err
			}
		}
	}
	small, err := loadgen.BuildPayload(loadgen.Traces, 10, o.attrSize, loadgen.Proto, false)
	if err != nil {
		return nil, err
	}
	hp.small = small.Proto
	if hp.exemptBody, err = sizedPayload(loadgen.Metrics, o.exemptKiB<<10, o.attrSize, false); err != nil {
		return nil, err
	}
	return hp, nil
}

// runPeer runs the hostile peer of scenario until ctx ends; every request
// it made is recorded when it returns.
func runPeer(ctx context.Context, scenario string, env *peerEnv) error {
	var lanes []func(context.Context)
	o := env.o
	switch scenario {
	case scenarioBaseline:
		return nil
	case scenarioTrickle:
		for range o.trickleConns {
			lanes = append(lanes, env.trickleLane)
		}
	case scenarioGzipBomb:
		c := env.hostileHTTPClient(o.bombLanes)
		defer c.CloseIdleConnections()
		for i := range o.bombLanes {
			lanes = append(lanes, func(ctx context.Context) { env.bombLane(ctx, c, i) })
		}
	case scenarioBigLength:
		lanes = append(lanes, env.bigLengthLane)
	case scenarioGRPCInflate:
		conn, err := dialGRPC(hostileAddr, env.grpcAddr)
		if err != nil {
			return err
		}
		defer conn.Close()
		pm, err := prepare(ctx, conn, env.payloads.inflated)
		if err != nil {
			return fmt.Errorf("preparing the inflated message: %w", err)
		}
		const lanesN = 2
		for range lanesN {
			lanes = append(lanes, func(ctx context.Context) { env.inflateLane(ctx, conn, pm, lanesN) })
		}
	case scenarioGRPCShrink, scenarioGRPCShrinkControl:
		return env.shrinkWaves(ctx, scenario == scenarioGRPCShrink)
	case scenarioLaneTrickle:
		lanes = append(lanes, env.laneTrickleLane)
	case scenarioSilentAddresses:
		for i := range o.silentAddresses {
			for range o.silentConns {
				lanes = append(lanes, func(ctx context.Context) { env.silentBodyLane(ctx, attackerAddr(i)) })
			}
		}
	case scenarioShutdown:
		return env.shutdownPeer(ctx)
	case scenarioLaneLift:
		c := env.hostileHTTPClient(o.bombLanes)
		defer c.CloseIdleConnections()
		for i := range o.bombLanes {
			lanes = append(lanes, func(ctx context.Context) { env.bombLane(ctx, c, i) })
		}
		for range o.liftConns {
			lanes = append(lanes, func(ctx context.Context) { env.abortedBodyLane(ctx, attackerAddr(1)) })
		}
	case scenarioExemptOverdraft:
		for i := range o.exemptAddresses {
			for range o.exemptConns {
				lanes = append(lanes, func(ctx context.Context) { env.exemptLane(ctx, attackerAddr(i)) })
			}
		}
	case scenarioHoldFlood, scenarioSilentStreams:
		streams, conns := o.floodGRPC, 4
		if scenario == scenarioSilentStreams {
			streams, conns = o.silentStreams, 2
		} else {
			for range o.floodHTTP {
				lanes = append(lanes, env.heldBodyLane)
			}
		}
		cs := make([]*grpc.ClientConn, conns)
		for i := range cs {
			c, err := dialGRPC(hostileAddr, env.grpcAddr)
			if err != nil {
				return err
			}
			defer c.Close()
			cs[i] = c
		}
		for i := range streams {
			lanes = append(lanes, func(ctx context.Context) { env.silentStreamLane(ctx, cs[i%len(cs)]) })
		}
	default:
		return fmt.Errorf("unknown scenario %q", scenario)
	}
	var wg sync.WaitGroup
	for _, lane := range lanes {
		wg.Go(func() { lane(ctx) })
	}
	wg.Wait()
	return nil
}

// pause waits out the rest of minCycle after a request that lasted
// lifetime; false when ctx ended.
func pause(ctx context.Context, lifetime time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-time.After(minCycle - lifetime):
		return true
	}
}

// dialFrom opens a TCP connection to addr from the loopback address src.
func dialFrom(ctx context.Context, src netip.Addr, addr string) (net.Conn, error) {
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 5 * time.Second}
	return d.DialContext(ctx, "tcp", addr)
}

func (e *peerEnv) hostileHTTPClient(conns int) *http.Client {
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(hostileAddr, 0)), Timeout: 5 * time.Second}
	return &http.Client{Transport: &http.Transport{
		Proxy: nil, DialContext: d.DialContext, MaxIdleConnsPerHost: conns, DisableCompression: true,
	}}
}

// httpResult is the gateway's answer on a raw connection.
type httpResult struct {
	code        int
	body        []byte
	contentType string
	err         error
}

// awaitAnswer reads the gateway's answer to the request written on conn.
func awaitAnswer(conn net.Conn) <-chan httpResult {
	ch := make(chan httpResult, 1)
	go func() {
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			ch <- httpResult{err: err}
			return
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		ch <- httpResult{code: resp.StatusCode, body: body, contentType: resp.Header.Get("Content-Type")}
	}()
	return ch
}

// endHTTP records the outcome of a raw request: its answer, or the
// connection the gateway closed without one.
func endHTTP(r *hreq, res httpResult) {
	if res.err != nil {
		r.end(classRefused, "connection ended without an answer: "+shorten(res.err.Error(), 120))
		return
	}
	c, msg := classifyHTTP(res.code, res.body, res.contentType)
	r.end(c, msg)
}

// requestHead is the head of a POST of OTLP traces to the gateway.
func (e *peerEnv) requestHead(headers string) []byte {
	return []byte("POST /v1/traces HTTP/1.1\r\nHost: " + e.httpAddr + "\r\nContent-Type: application/x-protobuf\r\n" + headers + "\r\n")
}

func chunk(b []byte) []byte {
	out := make([]byte, 0, len(b)+16)
	out = append(out, strconv.FormatInt(int64(len(b)), 16)...)
	out = append(out, "\r\n"...)
	out = append(out, b...)
	return append(out, "\r\n"...)
}

// rawLane sends raw HTTP requests of kind on connections of their own,
// one at a time until ctx ends: write writes a request (and may go on
// writing until its context ends) while the gateway's answer is awaited;
// then the connection is closed, and the next one opened after minCycle.
func (e *peerEnv) rawLane(ctx context.Context, kind string, write func(ctx context.Context, conn net.Conn)) {
	e.rawLaneFrom(ctx, hostileAddr, kind, write)
}

// rawLaneFrom is rawLane from the loopback address src.
func (e *peerEnv) rawLaneFrom(ctx context.Context, src netip.Addr, kind string, write func(ctx context.Context, conn net.Conn)) {
	for ctx.Err() == nil {
		r := e.peer.begin(kind)
		conn, err := dialFrom(ctx, src, e.httpAddr)
		if err != nil {
			r.end(classError, err.Error())
		} else {
			ans := awaitAnswer(conn)
			wctx, stopWriting := context.WithCancel(ctx)
			written := make(chan struct{})
			go func() {
				defer close(written)
				write(wctx, conn)
			}()
			select {
			case res := <-ans:
				endHTTP(r, res)
			case <-ctx.Done():
				r.held()
			}
			stopWriting()
			conn.Close()
			<-written
		}
		if !pause(ctx, r.lifetime()) {
			return
		}
	}
}

// trickleLane is the fill-then-trickle peer: one connection at a time.
func (e *peerEnv) trickleLane(ctx context.Context) {
	ts := e.payloads.trickle
	e.rawLane(ctx, "trickle", func(ctx context.Context, conn net.Conn) {
		_, _ = conn.Write(append(e.requestHead("Content-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n"), chunk(ts.head)...))
		tick := time.NewTicker(e.o.trickleEvery)
		defer tick.Stop()
		for _, piece := range ts.pieces {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
				_, _ = conn.Write(chunk(piece))
			}
		}
	})
}

// bombLane sends the gzip bombs back to back, one size after the other.
func (e *peerEnv) bombLane(ctx context.Context, c *http.Client, lane int) {
	hp := e.payloads
	for i := lane; ctx.Err() == nil; i++ {
		k := i % len(hp.bombs)
		r := e.peer.begin(fmt.Sprintf("gzip-%dMiB", hp.bombMiB[k]))
		e.post(ctx, c, r, "/v1/traces", hp.bombs[k], true)
		if !pause(ctx, r.lifetime()) {
			return
		}
	}
}

// post sends the hostile request r, an OTLP/HTTP body to path (gzip'd:
// gz), with c, and records what became of it.
func (e *peerEnv) post(ctx context.Context, c *http.Client, r *hreq, path string, body []byte, gz bool) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+e.httpAddr+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/x-protobuf")
	if gz {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := c.Do(req)
	switch {
	case err != nil && ctx.Err() != nil:
		r.held()
	case err != nil:
		r.end(classRefused, "no answer: "+shorten(err.Error(), 120))
	default:
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		resp.Body.Close()
		cl, msg := classifyHTTP(resp.StatusCode, b, resp.Header.Get("Content-Type"))
		r.end(cl, msg)
	}
}

// bigLengthLane sends a chain of bodies of a known length at least the
// budget, each at -length-rate.
func (e *peerEnv) bigLengthLane(ctx context.Context) {
	size := int(float64(e.budget) * e.o.lengthFactor)
	blob := blobForSize(size)
	prefix := blobRequestPrefix(blob)
	head := e.requestHead("Content-Length: " + strconv.Itoa(len(prefix)+blob) + "\r\n")
	e.rawLane(ctx, "content-length", func(ctx context.Context, conn net.Conn) {
		_, _ = conn.Write(append(head, prefix...))
		pacedWrite(ctx, conn, blob, e.o.lengthRateMiB)
	})
}

// pacedWrite writes n letters to w at rateMiB MiB/s, in 64 KiB writes,
// until done, an error, or ctx's end.
func pacedWrite(ctx context.Context, w io.Writer, n int, rateMiB float64) {
	const step = 64 << 10
	buf := make([]byte, step)
	for i := range buf {
		buf[i] = 'a'
	}
	start := time.Now()
	for written := 0; written < n; {
		k := min(step, n-written)
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		written += k
		due := start.Add(time.Duration(float64(written) / (rateMiB * (1 << 20)) * float64(time.Second)))
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(due)):
		}
	}
}

// inflateLane makes inflated calls at its share of -inflate-rate.
func (e *peerEnv) inflateLane(ctx context.Context, conn *grpc.ClientConn, pm *grpc.PreparedMsg, lanes int) {
	cycle := time.Duration(float64(lanes) / e.o.inflateRate * float64(time.Second))
	for ctx.Err() == nil {
		r := e.peer.begin("grpc-inflated")
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		err := callPrepared(cctx, conn, pm)
		own := cctx.Err() != nil
		cancel()
		e.endGRPC(ctx, r, err, own)
		select {
		case <-ctx.Done():
			return
		case <-time.After(cycle - r.lifetime()):
		}
	}
}

// endGRPC records the outcome of a hostile gRPC request.
func (e *peerEnv) endGRPC(ctx context.Context, r *hreq, err error, ownDeadline bool) {
	if err != nil && ctx.Err() != nil {
		r.held()
		return
	}
	c, msg := classifyGRPC(err, ownDeadline)
	r.end(c, msg)
}

// heldBodyLane sends request heads announcing a normal body and never the
// body.
func (e *peerEnv) heldBodyLane(ctx context.Context) {
	head := e.requestHead("Content-Length: " + strconv.Itoa(e.normalDecoded) + "\r\n")
	e.rawLane(ctx, "http-held-body", func(_ context.Context, conn net.Conn) {
		_, _ = conn.Write(head)
	})
}

// silentStreamLane opens Export streams that never send their message,
// reopening each as soon as the gateway ends it.
func (e *peerEnv) silentStreamLane(ctx context.Context, conn *grpc.ClientConn) {
	for ctx.Err() == nil {
		r := e.peer.begin("grpc-silent-stream")
		err := holdStream(ctx, conn)
		e.endGRPC(ctx, r, err, false)
		if !pause(ctx, r.lifetime()) {
			return
		}
	}
}

// holdStream opens an Export stream (its headers go out at once), sends
// nothing, and returns how the gateway ended it.
func holdStream(ctx context.Context, conn *grpc.ClientConn) error {
	s, err := conn.NewStream(ctx, unaryDesc, tracesMethod)
	if err != nil {
		return err
	}
	var resp []byte
	err = s.RecvMsg(&resp)
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}
