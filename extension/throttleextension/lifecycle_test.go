// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"bytes"
	"context"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// Lifecycle: Start and Shutdown in any order and more than once, Shutdown
// while requests are in flight, several servers sharing one extension, two
// throttle extensions in one process. Run under -race; every test checks
// that no goroutine is left.

// verifyNoLeaks checks, after every other cleanup of t (servers, clients,
// extensions) has run, that no goroutine started since is left.
func verifyNoLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) })
}

// gate holds requests inside the receiver's handler until released.
type gate struct {
	entered chan struct{}
	release chan struct{}
	once    sync.Once
}

func newGate(capacity int) *gate {
	return &gate{entered: make(chan struct{}, capacity), release: make(chan struct{})}
}

func (g *gate) open() { g.once.Do(func() { close(g.release) }) }

func (g *gate) hold() {
	if g == nil {
		return
	}
	g.entered <- struct{}{}
	<-g.release
}

// traceReceiver stands for a receiver's handlers: it reads the request,
// optionally waits on a gate, and counts what it accepted.
type traceReceiver struct {
	ptraceotlp.UnimplementedGRPCServer
	gate     *gate
	accepted atomic.Int64
}

func (r *traceReceiver) Export(context.Context, ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	r.gate.hold()
	r.accepted.Add(1)
	return ptraceotlp.NewExportResponse(), nil
}

func (r *traceReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	_, _ = io.Copy(io.Discard, req.Body)
	r.gate.hold()
	r.accepted.Add(1)
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

// serveHTTP serves the receiver behind the extension's HTTP middleware on
// 127.0.0.1:0 until cleanup and returns the traces URL.
func serveHTTP(t *testing.T, e *throttleExtension, rcv http.Handler) string {
	t.Helper()
	ctx := context.Background()
	wrap, err := e.GetHTTPHandler(ctx)
	require.NoError(t, err)
	h, err := wrap(ctx, rcv)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Serve(ln) })
	t.Cleanup(func() {
		_ = srv.Close()
		wg.Wait()
	})
	return "http://" + ln.Addr().String() + "/v1/traces"
}

// serveGRPC serves the receiver with the extension's gRPC server options on
// 127.0.0.1:0 until cleanup and returns a client for it.
func serveGRPC(t *testing.T, e *throttleExtension, rcv *traceReceiver) ptraceotlp.GRPCClient {
	t.Helper()
	opts, err := e.GetGRPCServerOptions(context.Background())
	require.NoError(t, err)
	s := grpc.NewServer(opts...)
	ptraceotlp.RegisterGRPCServer(s, rcv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.Serve(ln) })
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = conn.Close()
		s.Stop()
		wg.Wait()
	})
	return ptraceotlp.NewGRPCClient(conn)
}

func testTraces() ptrace.Traces {
	td := ptrace.NewTraces()
	td.ResourceSpans().AppendEmpty().ScopeSpans().AppendEmpty().Spans().AppendEmpty().SetName("span")
	return td
}

var traceBody = func() []byte {
	b, err := ptraceotlp.NewExportRequestFromTraces(testTraces()).MarshalProto()
	if err != nil {
		panic(err)
	}
	return b
}()

// newHTTPClient is a client without keep-alive, so no idle connection
// outlives the test.
func newHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
}

// postTraces posts one OTLP/HTTP traces request and returns its status code.
func postTraces(c *http.Client, url string) (int, error) {
	resp, err := c.Post(url, "application/x-protobuf", bytes.NewReader(traceBody))
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// exportTraces exports one span with the SDKs' 10 s deadline: while other
// calls of its client hold its share of the budget (what each message may
// decode to, from before it is read), a call waits for most of its
// deadline rather than being refused.
func exportTraces(c ptraceotlp.GRPCClient) codes.Code {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Export(ctx, ptraceotlp.NewExportRequestFromTraces(testTraces()))
	return status.Code(err)
}

// TestLifecycleAnyOrder runs Start and Shutdown sequences, sequential and
// concurrent, with the stale watchdog and the status page on.
func TestLifecycleAnyOrder(t *testing.T) {
	ctx := context.Background()
	host := componenttest.NewNopHost()
	withAll := func(c *Config) {
		c.StaleAfter = time.Second
		require.NoError(t, confmap.NewFromStringMap(map[string]any{
			"status": map[string]any{"endpoint": "127.0.0.1:0"},
		}).Unmarshal(c))
	}
	for _, seq := range [][]string{
		{"shutdown"},
		{"shutdown", "start"},
		{"shutdown", "shutdown", "start", "start"},
		{"start", "start", "shutdown", "shutdown"},
		{"start", "shutdown", "start", "shutdown"},
		{"start"}, // Shutdown at cleanup only
	} {
		t.Run(joinOps(seq), func(t *testing.T) {
			verifyNoLeaks(t)
			e := newTestExtension(t, newFakeSource(50), testConfig(t, withAll), nopSettings())
			for _, op := range seq {
				switch op {
				case "start":
					require.NoError(t, e.Start(ctx, host))
				case "shutdown":
					require.NoError(t, e.Shutdown(ctx))
				}
				// Decisions are safe in every phase.
				for _, s := range allSignals {
					_ = e.Decide(s)
					_ = e.State(s)
				}
			}
			require.NoError(t, e.Shutdown(ctx))
		})
	}

	t.Run("concurrent", func(t *testing.T) {
		verifyNoLeaks(t)
		for range 20 {
			e := newTestExtension(t, newFakeSource(95), testConfig(t, withAll), nopSettings())
			var wg sync.WaitGroup
			for i := range 8 {
				wg.Go(func() {
					if i%2 == 0 {
						assert.NoError(t, e.Start(ctx, host)) //nolint:testifylint // runs in a wg.Go goroutine, where require must not be used
					} else {
						assert.NoError(t, e.Shutdown(ctx)) //nolint:testifylint // runs in a wg.Go goroutine, where require must not be used
					}
					_ = e.Decide(decision.SignalTraces)
					_ = e.RetryDelay(decision.VerdictDenyOpen)
				})
			}
			wg.Wait()
			require.NoError(t, e.Shutdown(ctx))
		}
	})
}

func joinOps(ops []string) string {
	var b bytes.Buffer
	for i, op := range ops {
		if i > 0 {
			b.WriteByte('_')
		}
		b.WriteString(op)
	}
	return b.String()
}

// TestShutdownWithRequestsInFlight: requests admitted and held inside the
// receiver on an HTTP and a gRPC server while the extension shuts down.
// Shutdown does not wait for them; they complete; the admission budget is
// released; later requests are still answered (the last decision holds), and
// nothing panics or leaks. The budget's client share holds what the four
// gRPC calls may each decode to (4 MiB) at once.
func TestShutdownWithRequestsInFlight(t *testing.T) {
	verifyNoLeaks(t)
	const n = 4
	g := newGate(2 * n)
	rcv := &traceReceiver{gate: g}
	e := startTestExtension(t, newFakeSource(50), testConfig(t, func(c *Config) {
		c.StaleAfter = time.Second
		c.Admission.MaxInflightBytes = admission.FixedInflightBudget(64 * admission.MiB)
	}), nopSettings())
	url := serveHTTP(t, e, rcv)
	gc := serveGRPC(t, e, rcv)
	hc := newHTTPClient()
	defer g.open()

	var wg sync.WaitGroup
	httpCodes := make(chan int, n)
	grpcCodes := make(chan codes.Code, n)
	for range n {
		wg.Go(func() {
			code, err := postTraces(hc, url)
			assert.NoError(t, err)
			httpCodes <- code
		})
		wg.Go(func() { grpcCodes <- exportTraces(gc) })
	}
	for i := range 2 * n {
		select {
		case <-g.entered:
		case <-time.After(e2eWait):
			t.Fatalf("%d of %d requests reached the receiver", i, 2*n)
		}
	}
	reserved := e.runner.MiddlewareConfig().Admission.Stats().Reserved
	assert.Positive(t, reserved, "the held HTTP requests hold budget")

	require.NoError(t, e.Shutdown(context.Background()), "Shutdown returns with requests in flight")
	require.NoError(t, e.Shutdown(context.Background()))

	g.open()
	wg.Wait()
	close(httpCodes)
	close(grpcCodes)
	for c := range httpCodes {
		assert.Equal(t, http.StatusOK, c)
	}
	for c := range grpcCodes {
		assert.Equal(t, codes.OK, c)
	}
	assert.Equal(t, int64(2*n), rcv.accepted.Load())
	// A gRPC call gives its message's bytes back when its stream ends
	// (stats.End), which may come just after its client has its status.
	assert.Eventually(t, func() bool { return e.runner.MiddlewareConfig().Admission.Stats().Reserved == 0 },
		e2eWait, time.Millisecond, "every reservation was released")

	// After Shutdown (a receiver that outlives it, in a wrong order): still
	// answered, from the last published decision.
	code, err := postTraces(hc, url)
	require.NoError(t, err)
	assert.Equal(t, http.StatusOK, code)
	assert.Equal(t, codes.OK, exportTraces(gc))
}

// TestSharedByManyServers: two HTTP and two gRPC servers (the receivers of
// a pipeline) and the processor path share one extension under concurrent
// load while its state moves between Normal and Open.
func TestSharedByManyServers(t *testing.T) {
	verifyNoLeaks(t)
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(context.Background())) })
	src := newFakeSource(50)
	// A budget whose client share (half) holds what the ten concurrent
	// gRPC calls may each decode to (4 MiB) at once: the "auto" one of the
	// fake 100 MiB limit is 8 MiB.
	e := startTestExtension(t, src, testConfig(t, func(c *Config) {
		c.Admission.MaxInflightBytes = admission.FixedInflightBudget(128 * admission.MiB)
	}), metadatatest.NewSettings(tel))
	rcv := &traceReceiver{}
	urls := []string{serveHTTP(t, e, rcv), serveHTTP(t, e, rcv)}
	clients := []ptraceotlp.GRPCClient{serveGRPC(t, e, rcv), serveGRPC(t, e, rcv)}
	hc := newHTTPClient()

	check := func(wantHTTP int, wantGRPC codes.Code, wantVerdict decision.Verdict) {
		t.Helper()
		var wg sync.WaitGroup
		for range 5 {
			for _, u := range urls {
				wg.Go(func() {
					code, err := postTraces(hc, u)
					assert.NoError(t, err) //nolint:testifylint // runs in a wg.Go goroutine, where require must not be used
					assert.Equal(t, wantHTTP, code)
				})
			}
			for _, c := range clients {
				wg.Go(func() { assert.Equal(t, wantGRPC, exportTraces(c)) })
			}
			wg.Go(func() {
				v := e.Decide(decision.SignalTraces)
				e.RecordProcessorDecision(decision.SignalTraces, v)
				assert.Equal(t, wantVerdict, v)
			})
		}
		wg.Wait()
	}

	waitValid(t, src)
	check(http.StatusOK, codes.OK, decision.VerdictAdmit)
	src.SetMemoryShare(0.95)
	waitState(t, e, decision.StateOpen)
	check(http.StatusTooManyRequests, codes.ResourceExhausted, decision.VerdictDenyOpen)
	src.SetMemoryShare(0.5)
	waitState(t, e, decision.StateNormal)
	check(http.StatusOK, codes.OK, decision.VerdictAdmit)
	assert.Equal(t, int64(40), rcv.accepted.Load())

	// Every server's decisions land in the one extension's counter.
	m, err := tel.GetMetric("otelcol_throttle_requests")
	require.NoError(t, err)
	var total int64
	for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
		total += dp.Value
	}
	assert.Equal(t, int64(3*5*(2+2+1)), total)
	require.NoError(t, e.Shutdown(context.Background()))
}

// TestTwoThrottleExtensions: throttle and throttle/2 in one process, with
// different configurations and sources, sharing the MeterProvider as in a
// collector. Each decides on its own level and reports under its own ID; they
// start and shut down concurrently.
func TestTwoThrottleExtensions(t *testing.T) {
	verifyNoLeaks(t)
	ctx := context.Background()
	tel := componenttest.NewTelemetry()
	t.Cleanup(func() { require.NoError(t, tel.Shutdown(ctx)) })

	type inst struct {
		id  component.ID
		src *testutil.Source
		cfg *Config
		e   *throttleExtension
	}
	insts := []*inst{
		{id: component.MustNewID("throttle"), src: newFakeSource(95), cfg: testConfig(t, func(c *Config) {
			c.StaleAfter = 10 * time.Second // on, but out of reach of a starved -race run
		})},
		{id: component.MustNewIDWithName("throttle", "2"), src: newFakeSource(95), cfg: testConfig(t, func(c *Config) {
			c.CheckInterval = 15 * time.Millisecond
			c.Memory.Enter, c.Memory.Exit, c.Memory.Hard = 0.97, 0.96, 0.99
			// No budget: with "auto" (8 MiB of the 100 MiB limit) the
			// client's half holds what one gRPC call may decode to (4 MiB),
			// and its ten concurrent calls would wait for one another.
			c.Admission.MaxInflightBytes = admission.FixedInflightBudget(0)
		})},
	}
	for _, in := range insts {
		set := metadatatest.NewSettings(tel)
		set.ID = in.id
		ext, err := newFactory(factoryOptions{source: in.src}).Create(ctx, set, in.cfg)
		require.NoError(t, err)
		in.e = ext.(*throttleExtension)
	}
	var wg sync.WaitGroup
	for _, in := range insts {
		wg.Go(func() { assert.NoError(t, in.e.Start(ctx, componenttest.NewNopHost())) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, in := range insts {
			require.NoError(t, in.e.Shutdown(ctx))
		}
	})

	a, b := insts[0].e, insts[1].e
	waitState(t, a, decision.StateOpen)
	waitValid(t, insts[1].src)
	assert.Equal(t, decision.StateNormal, b.State(decision.SignalTraces), "0.95 is under throttle/2's enter line")

	rcvA, rcvB := &traceReceiver{}, &traceReceiver{}
	urlA, urlB := serveHTTP(t, a, rcvA), serveHTTP(t, b, rcvB)
	gcA, gcB := serveGRPC(t, a, rcvA), serveGRPC(t, b, rcvB)
	hc := newHTTPClient()
	var load sync.WaitGroup
	for range 10 {
		load.Go(func() {
			code, err := postTraces(hc, urlA)
			assert.NoError(t, err) //nolint:testifylint // runs in a wg.Go goroutine, where require must not be used
			assert.Equal(t, http.StatusTooManyRequests, code)
			assert.Equal(t, codes.ResourceExhausted, exportTraces(gcA))
		})
		load.Go(func() {
			code, err := postTraces(hc, urlB)
			assert.NoError(t, err) //nolint:testifylint // runs in a wg.Go goroutine, where require must not be used
			assert.Equal(t, http.StatusOK, code)
			assert.Equal(t, codes.OK, exportTraces(gcB))
		})
	}
	load.Wait()
	assert.Zero(t, rcvA.accepted.Load())
	assert.Equal(t, int64(20), rcvB.accepted.Load())

	// One state series per extension and signal, each with its own value.
	m, err := tel.GetMetric("otelcol_throttle_state")
	require.NoError(t, err)
	got := map[string]int64{}
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		id, _ := dp.Attributes.Value("extension")
		sig, _ := dp.Attributes.Value("signal")
		if sig.AsString() == "traces" {
			got[id.AsString()] = dp.Value
		}
	}
	assert.Equal(t, map[string]int64{"throttle": int64(decision.StateOpen), "throttle/2": int64(decision.StateNormal)}, got)

	// Moving one source moves only its extension.
	insts[1].src.SetMemoryShare(0.99)
	waitState(t, b, decision.StateOpen)
	insts[0].src.SetMemoryShare(0.5)
	waitState(t, a, decision.StateNormal)

	// Shut down concurrently, twice each, in random order.
	for _, i := range rand.Perm(2 * len(insts)) {
		in := insts[i%len(insts)]
		wg.Go(func() { assert.NoError(t, in.e.Shutdown(ctx)) })
	}
	wg.Wait()
}

// TestDisabledAdmitsPastTheBudget: with enabled: false nothing is refused
// or made to wait, the admission budget included: four bodies read at once,
// together three times the budget (past its overdraft for exempt signals
// too), are all read to their end and answered 200.
func TestDisabledAdmitsPastTheBudget(t *testing.T) {
	verifyNoLeaks(t)
	const n, part = 4, 768 << 10
	e := startTestExtension(t, newFakeSource(50), testConfig(t, func(c *Config) {
		c.Enabled = false
		c.Admission.MaxInflightBytes = admission.FixedInflightBudget(admission.MiB)
	}), nopSettings())
	// The receiver reads the first part of each body and reports it, then
	// reads on to the end: the parts are read while every body is open. A
	// body cut short is answered 500.
	readPart := make(chan int64, n)
	url := serveHTTP(t, e, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, _ := io.CopyN(io.Discard, r.Body, part)
		readPart <- got
		rest, err := io.Copy(io.Discard, r.Body)
		if err != nil || got+rest != 2*part {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	hc := newHTTPClient()

	// Each client sends its first part, then the rest once every first part
	// has been read.
	var clients, writers sync.WaitGroup
	var restOnce sync.Once
	rest := make(chan struct{})
	sendRest := func() { restOnce.Do(func() { close(rest) }) }
	answered := make(chan int, n)
	bodies := make([]*io.PipeWriter, n)
	for i := range bodies {
		pr, pw := io.Pipe()
		bodies[i] = pw
		clients.Go(func() {
			resp, err := hc.Post(url, "application/x-protobuf", pr)
			if err != nil {
				answered <- 0
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			answered <- resp.StatusCode
		})
		writers.Go(func() {
			if _, err := pw.Write(make([]byte, part)); err != nil {
				return
			}
			<-rest
			if _, err := pw.Write(make([]byte, part)); err == nil {
				_ = pw.Close()
			}
		})
	}
	defer func() {
		sendRest()
		for _, pw := range bodies {
			_ = pw.CloseWithError(io.ErrUnexpectedEOF)
		}
		writers.Wait()
		clients.Wait()
	}()
	for i := range n {
		select {
		case got := <-readPart:
			require.Equal(t, int64(part), got, "a body's first part was cut short")
		case code := <-answered:
			t.Fatalf("%d of %d bodies read their first part; another was answered %d", i, n, code)
		case <-time.After(e2eWait):
			t.Fatalf("%d of %d bodies read their first part", i, n)
		}
	}
	sendRest()
	for range n {
		select {
		case code := <-answered:
			assert.Equal(t, http.StatusOK, code)
		case <-time.After(e2eWait):
			t.Fatal("a body read past its first part was not answered")
		}
	}
}
