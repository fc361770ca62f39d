// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.yaml.in/yaml/v3"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

func TestItemsFor(t *testing.T) {
	for _, tc := range []struct{ decoded, probeSize, probeItems, want int }{
		{6 << 20, 42_000, 100, 14980}, // rounded up
		{42_000, 42_000, 100, 100},
		{1, 42_000, 100, 1},
		{0, 42_000, 100, 1}, // at least one
		{100, 0, 100, 1},    // no probe
		{100, 100, 0, 1},
	} {
		assert.Equal(t, tc.want, itemsFor(tc.decoded, tc.probeSize, tc.probeItems), "%+v", tc)
	}
}

// A sized payload is at least the size asked for and hardly more, in either
// signal, and gzip'd only when asked.
func TestSizedPayload(t *testing.T) {
	for _, tc := range []struct {
		signal  loadgen.Signal
		decoded int
		gz      bool
	}{
		{loadgen.Traces, 64 << 10, true},
		{loadgen.Traces, 6 << 20, true},
		{loadgen.Metrics, 640 << 10, false},
	} {
		p, err := sizedPayload(tc.signal, tc.decoded, 256, tc.gz)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, p.RawSize, tc.decoded)
		assert.Less(t, float64(p.RawSize), 1.02*float64(tc.decoded))
		if tc.gz {
			assert.True(t, bytes.HasPrefix(p.Body, []byte{0x1f, 0x8b}), "gzip'd")
			assert.Less(t, len(p.Body), p.RawSize)
		} else {
			assert.Len(t, p.Body, p.RawSize)
		}
	}
}

func TestAttackerAddr(t *testing.T) {
	assert.Equal(t, hostileAddr, attackerAddr(0))
	assert.Equal(t, "127.0.0.9", attackerAddr(7).String())
	assert.Equal(t, "127.0.0.251", attackerAddr(maxAttackers-1).String())
	assert.Equal(t, attackerAddr(maxAttackers-1), attackerAddr(maxAttackers+10), "capped below the batch client's address")
	assert.NotEqual(t, batchAddr, attackerAddr(maxAttackers))
	assert.Equal(t, "batch-6MiB", (&batchClient{decoded: 6 << 20}).kind())
	assert.Equal(t, "batch-64KiB", (&batchClient{decoded: 64 << 10}).kind())
}

// gunzipPrefix decompresses what a gzip stream cut after b yields.
func gunzipPrefix(t *testing.T, b []byte) int {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	n, err := io.Copy(io.Discard, io.LimitReader(zr, 64<<20))
	if err != nil {
		require.ErrorIs(t, err, io.ErrUnexpectedEOF)
	}
	return int(n)
}

// The lane-trickle body is zeros; its head alone yields all of its bytes,
// and what its tail sends in an idle timeout (10 s) at the default rate
// yields more than the minimum progress the gateway asks for in that time
// (64 KiB): the body keeps the lane however slowly it comes.
func TestLaneStream(t *testing.T) {
	o := defaultOptions()
	ls, err := buildLaneStream(o.laneMiB<<20, o.laneHeadMiB<<20)
	require.NoError(t, err)
	whole := append(bytes.Clone(ls.head), ls.tail...)
	zr, err := gzip.NewReader(bytes.NewReader(whole))
	require.NoError(t, err)
	out, err := io.ReadAll(zr)
	require.NoError(t, err)
	assert.Len(t, out, o.laneMiB<<20)
	assert.Equal(t, -1, bytes.IndexFunc(out, func(r rune) bool { return r != 0 }), "zeros")
	assert.Less(t, len(whole), 32<<10, "a few KiB on the wire")

	assert.Equal(t, o.laneHeadMiB<<20, gunzipPrefix(t, ls.head), "the head is flushed")
	tenSeconds := append(bytes.Clone(ls.head), ls.tail[:10*o.laneRate]...)
	assert.Greater(t, gunzipPrefix(t, tenSeconds)-(o.laneHeadMiB<<20), 64<<10)
}

func TestSetupFor(t *testing.T) {
	o := defaultOptions()
	base := setupFor(&o, scenarioBaseline)
	assert.Equal(t, gatewaySettings{cpus: o.cpus, memMiB: o.memMiB}, base.gw)
	assert.Equal(t, targetCriteria, base.target)
	for _, sc := range peerScenarios {
		assert.Equal(t, base, setupFor(&o, sc), "%s: unchanged", sc)
	}
	assert.Equal(t, base, setupFor(&o, scenarioLaneLift))

	shrink := setupFor(&o, scenarioGRPCShrink)
	assert.Equal(t, shrink, setupFor(&o, scenarioGRPCShrinkControl), "the control differs by its peer alone")
	assert.Equal(t, "1.5 CPU, 1024 MiB, throttle: admission: max_inflight_bytes: 16MiB", shrink.gw.String())
	assert.Equal(t, targetNoOOM, shrink.target)

	lane := setupFor(&o, scenarioLaneTrickle)
	assert.Equal(t, 6<<20, lane.batchBytes)
	assert.Equal(t, time.Second, lane.batchCycle)
	assert.Equal(t, targetBatches, lane.target)
	assert.Equal(t, base.gw, lane.gw)

	silent := setupFor(&o, scenarioSilentAddresses)
	assert.Equal(t, 64<<10, silent.batchBytes)
	assert.Equal(t, "admission:\n  max_inflight_bytes: 16MiB", silent.gw.throttle)
	o.silentBudget = "auto"
	assert.Empty(t, setupFor(&o, scenarioSilentAddresses).gw.throttle, "auto: the shipped default")

	sd := setupFor(&o, scenarioShutdown)
	assert.True(t, sd.shutdown)
	assert.Equal(t, targetShutdown, sd.target)
	assert.Equal(t, targetReserved, setupFor(&o, scenarioExemptOverdraft).target)
	for _, sc := range hostileScenarios {
		assert.NotEmpty(t, scenarioDescriptions[sc], sc)
	}
}

// The gateway's configuration carries a scenario's throttle settings
// where the collector reads them, and none for the shipped defaults.
func TestGatewayConfig(t *testing.T) {
	o := defaultOptions()
	throttle := func(sc string) any {
		gc := gatewayConfig{HTTPPort: 1, GRPCPort: 2, MetricsPort: 3, SinkAddr: "127.0.0.1:4", Throttle: setupFor(&o, sc).gw.throttle}
		cfg, err := colconfig.Render(gatewayTmpl, gc)
		require.NoError(t, err)
		var doc map[string]map[string]any
		require.NoError(t, yaml.Unmarshal(cfg, &doc), "%s", cfg)
		require.Contains(t, doc["extensions"], "throttle")
		return doc["extensions"]["throttle"]
	}
	assert.Equal(t, map[string]any{}, throttle(scenarioBaseline))
	assert.Equal(t, map[string]any{"admission": map[string]any{"max_inflight_bytes": "16MiB"}}, throttle(scenarioGRPCShrink))
	assert.Equal(t, map[string]any{"rules": map[string]any{"metrics": map[string]any{"enabled": false}}}, throttle(scenarioExemptOverdraft))
}

func TestTargetResult(t *testing.T) {
	batches := func(ok, refused int) [numClasses]int {
		var c [numClasses]int
		c[classOK], c[classBudget] = ok, refused
		return c
	}
	for _, tc := range []struct {
		name string
		r    roundResult
		want bool
		has  string
	}{
		{"no OOM", roundResult{target: targetNoOOM}, true, "0 OOM kills"},
		{"OOM", roundResult{target: targetNoOOM, oomKills: 1, restarts: 1}, false, "1 OOM kills"},
		{"restart only", roundResult{target: targetNoOOM, restarts: 1}, false, "1 restarts"},
		{"batches at 90 %", roundResult{target: targetBatches, batch: batches(9, 1)}, true, "9/10 accepted (90.0 %)"},
		{"batches below", roundResult{target: targetBatches, batch: batches(0, 27)}, false, "0/27"},
		{"no batch", roundResult{target: targetBatches}, false, "no batch sent"},
		{"quick exit", roundResult{target: targetShutdown, shutdown: true, exitAfter: 2 * time.Second}, true, "exited 2.0 s"},
		{"slow exit", roundResult{target: targetShutdown, shutdown: true, exitAfter: 35 * time.Second}, false, "exited 35.0 s"},
		{"killed", roundResult{target: targetShutdown, shutdown: true, exitAfter: 60 * time.Second, exitKilled: true}, false, "killed"},
		{"no SIGTERM", roundResult{target: targetShutdown}, false, "no SIGTERM"},
		{"reserved within", roundResult{target: targetReserved, limit: 120 << 20, peakReserved: 10 << 20}, true, "peak reserved 10.0 MiB (1.00 × limit/12 = 10.0 MiB)"},
		{"overdraft", roundResult{target: targetReserved, limit: 120 << 20, peakReserved: 20 << 20}, false, "2.00 ×"},
		{"reserved, OOM", roundResult{target: targetReserved, limit: 120 << 20, peakReserved: 1 << 20, oomKills: 1}, false, "1 OOM kills"},
		{"reserved, no limit known", roundResult{target: targetReserved}, false, ""},
	} {
		m, ok := tc.r.targetResult()
		assert.Equal(t, tc.want, ok, tc.name)
		assert.Contains(t, m, tc.has, tc.name)
		assert.Equal(t, tc.want, tc.r.passed(), tc.name)
	}
	m, ok := (&roundResult{}).targetResult()
	assert.Empty(t, m, "the criteria have no target figure")
	assert.False(t, ok)
}

// The honest batch client's answers of the window are counted by class.
func TestAnalyseBatch(t *testing.T) {
	r := &roundResult{window: 10 * time.Second}
	r.analyse(nil, []answer{
		at("batch-6MiB", 1, classOK), at("batch-6MiB", 6, classBudget), at("batch-6MiB", 11, classOK),
		at("batch-6MiB", 14, classOK), at("batch-6MiB", 20, classOK), // after the window
	}, nil, 5*time.Second)
	assert.Equal(t, "batch-6MiB", r.batchKind)
	share, ok := r.batchAccepted()
	require.True(t, ok)
	assert.InDelta(t, 2.0/3, share, 1e-9)
}

// refuseBudget answers as the throttle does when the budget is full, and
// closes the connection.
func refuseBudget(w http.ResponseWriter) {
	w.Header().Set("Connection", "close")
	http.Error(w, "throttle: collector overloaded (budget)", http.StatusTooManyRequests)
}

// The aborted lane sends chunked requests, from the address it is given,
// that close their connection without a body byte.
func TestAbortedBodyLane(t *testing.T) {
	type seen struct {
		remote, te string
		read       int64
		err        error
	}
	var mu sync.Mutex
	var got []seen
	stub := gatewayStub(t, func(w http.ResponseWriter, r *http.Request) {
		s := seen{remote: r.RemoteAddr, te: strings.Join(r.TransferEncoding, ",")}
		s.read, s.err = io.Copy(io.Discard, r.Body)
		mu.Lock()
		got = append(got, s)
		mu.Unlock()
		refuseBudget(w)
	})
	e := &peerEnv{o: &options{}, peer: newPeer(time.Now()), httpAddr: stub}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	e.abortedBodyLane(ctx, attackerAddr(1))
	mu.Lock()
	require.NotEmpty(t, got)
	for _, s := range got {
		assert.True(t, strings.HasPrefix(s.remote, "127.0.0.3:"), s.remote)
		assert.Equal(t, "chunked", s.te)
		assert.Zero(t, s.read)
		require.Error(t, s.err, "the client went away before the body's end")
	}
	mu.Unlock()
	for _, a := range e.peer.snapshot() {
		assert.Equal(t, "aborted-chunked", a.who)
	}
}

// The silent lane's request is answered by the gateway, not ended by the
// client: the stub sees a chunked request without a byte of body for as
// long as it waits.
func TestSilentBodyLane(t *testing.T) {
	var waited atomic.Int64
	stub := gatewayStub(t, func(w http.ResponseWriter, r *http.Request) {
		assert.True(t, strings.HasPrefix(r.RemoteAddr, "127.0.0.9:"), r.RemoteAddr)
		assert.Equal(t, []string{"chunked"}, r.TransferEncoding)
		got := make(chan int, 1)
		go func() {
			n, _ := r.Body.Read(make([]byte, 1))
			got <- n
		}()
		select {
		case n := <-got:
			assert.Zero(t, n, "a body byte came")
		case <-time.After(100 * time.Millisecond):
			waited.Add(1)
		}
		refuseBudget(w)
	})
	e := &peerEnv{o: &options{}, peer: newPeer(time.Now()), httpAddr: stub}
	ctx, cancel := context.WithTimeout(context.Background(), 350*time.Millisecond)
	defer cancel()
	e.silentBodyLane(ctx, attackerAddr(7))
	assert.Positive(t, waited.Load())
	refused := 0
	for _, a := range e.peer.snapshot() {
		// The last one may be held, or not even connected, at the end.
		if a.class != classHeld && a.class != classError {
			assert.Equal(t, classBudget, a.class, a.message)
			refused++
		}
	}
	assert.Positive(t, refused)
}

// The lane-trickle lane sends its head at once and then its tail, a piece
// a second: the gateway decompresses the head's bytes and more within a
// second and a half (at a rate whose first piece fills the decompressor's
// 32 KiB window, which it yields whole).
func TestLaneTrickleLane(t *testing.T) {
	ls, err := buildLaneStream(2<<20, 1<<20)
	require.NoError(t, err)
	var decoded atomic.Int64
	stub := gatewayStub(t, func(_ http.ResponseWriter, r *http.Request) {
		assert.Equal(t, "gzip", r.Header.Get("Content-Encoding"))
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			return
		}
		buf := make([]byte, 32<<10)
		for {
			n, err := zr.Read(buf)
			decoded.Add(int64(n))
			if err != nil {
				return
			}
		}
	})
	e := &peerEnv{o: &options{laneRate: 200}, peer: newPeer(time.Now()), httpAddr: stub, payloads: &hostilePayloads{lane: ls}}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	e.laneTrickleLane(ctx)
	assert.Greater(t, decoded.Load(), int64(1<<20), "the head, and the first piece of the tail")
	reqs := e.peer.snapshot()
	require.Len(t, reqs, 1)
	assert.Equal(t, classHeld, reqs[0].class, "held to the end")
}

// The batch client sends its batch gzip'd from its own address, one at a
// time, at least its cycle apart, and records every answer.
func TestBatchClient(t *testing.T) {
	p, err := batchPayload(64<<10, 256)
	require.NoError(t, err)
	var n atomic.Int64
	stub := gatewayStub(t, func(w http.ResponseWriter, r *http.Request) {
		assert.True(t, strings.HasPrefix(r.RemoteAddr, batchAddr.String()+":"), r.RemoteAddr)
		assert.Equal(t, "gzip", r.Header.Get("Content-Encoding"))
		b, _ := io.ReadAll(r.Body)
		assert.Len(t, b, len(p.Body))
		if n.Add(1)%2 == 0 {
			http.Error(w, "throttle: collector overloaded (budget)", http.StatusTooManyRequests)
			return
		}
	})
	start := time.Now()
	bc := newBatchClient("http://"+stub, p, 100*time.Millisecond, time.Second, start)
	ctx, cancel := context.WithTimeout(context.Background(), 450*time.Millisecond)
	defer cancel()
	bc.run(ctx, context.Background())
	as := bc.snapshot()
	require.GreaterOrEqual(t, len(as), 2)
	require.LessOrEqual(t, len(as), 5, "one every 100 ms at most")
	for i, a := range as {
		assert.Equal(t, "batch-64KiB", a.who)
		if i%2 == 0 {
			assert.Equal(t, classOK, a.class)
			assert.Equal(t, p.Items, a.items)
		} else {
			assert.Equal(t, classBudget, a.class)
		}
		if i > 0 {
			assert.GreaterOrEqual(t, a.sent-as[i-1].sent, 100*time.Millisecond)
		}
	}
}

// The empty Export that shrinks a peer's learnt size goes out as an empty
// message, and the inflated one behind it on any of the connections.
func TestEmptyExport(t *testing.T) {
	ws := &wireSizes{decoded: -1}
	conn := grpcStub(t, ws)
	empty, err := prepare(t.Context(), conn, []byte{})
	require.NoError(t, err)
	e := &peerEnv{peer: newPeer(time.Now())}
	require.True(t, e.primeEmpty(t.Context(), conn, empty))
	ws.mu.Lock()
	assert.Zero(t, ws.decoded)
	ws.mu.Unlock()
	reqs := e.peer.snapshot()
	require.Len(t, reqs, 1, "one accepted empty Export is enough")
	assert.Equal(t, classOK, reqs[0].class)
}

// The grpc-shrink message is a valid trace request whose span keeps a
// 4 MB attribute, a few KiB gzip'd.
func TestBlobMessage(t *testing.T) {
	msg := blobMessage(4_000_000)
	assert.InDelta(t, 4_000_000, len(msg), 8)
	req := ptraceotlp.NewExportRequest()
	require.NoError(t, req.UnmarshalProto(msg))
	require.Equal(t, 1, req.Traces().SpanCount())
	v, ok := req.Traces().ResourceSpans().At(0).ScopeSpans().At(0).Spans().At(0).Attributes().Get("blob")
	require.True(t, ok)
	assert.Greater(t, len(v.Str()), 3_999_900)
	assert.Less(t, gzipSize(msg), 16<<10)
}
