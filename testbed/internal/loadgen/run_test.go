// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/csv"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	_ "google.golang.org/grpc/encoding/gzip" // the server decompresses gzip messages
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// patternServer answers 429 to every third request it receives (in arrival
// order) and 200 to the others, and counts what it answered per path.
type patternServer struct {
	n        atomic.Int64
	mu       sync.Mutex
	answered map[string]map[int]int64
	items    map[string]int64
	t        *testing.T
	json     bool
	gzip     bool
}

func (s *patternServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if !assert.NoError(s.t, err) {
		return
	}
	if s.gzip {
		assert.Equal(s.t, "gzip", r.Header.Get("Content-Encoding"))
		zr, err := gzip.NewReader(bytes.NewReader(body))
		if !assert.NoError(s.t, err) {
			return
		}
		body, err = io.ReadAll(zr)
		assert.NoError(s.t, err)
	}
	assert.Equal(s.t, "a", r.Header.Get("X-Tenant"))
	var items int
	switch r.URL.Path {
	case "/v1/traces":
		req := ptraceotlp.NewExportRequest()
		assert.NoError(s.t, s.unmarshal(req.UnmarshalProto, req.UnmarshalJSON, body))
		items = req.Traces().SpanCount()
	case "/v1/metrics":
		req := pmetricotlp.NewExportRequest()
		assert.NoError(s.t, s.unmarshal(req.UnmarshalProto, req.UnmarshalJSON, body))
		items = req.Metrics().DataPointCount()
	case "/v1/logs":
		req := plogotlp.NewExportRequest()
		assert.NoError(s.t, s.unmarshal(req.UnmarshalProto, req.UnmarshalJSON, body))
		items = req.Logs().LogRecordCount()
	default:
		s.t.Errorf("unexpected path %s", r.URL.Path)
	}
	code := http.StatusOK
	if s.n.Add(1)%3 == 0 {
		code = http.StatusTooManyRequests
	}
	s.mu.Lock()
	if s.answered[r.URL.Path] == nil {
		s.answered[r.URL.Path] = map[int]int64{}
	}
	s.answered[r.URL.Path][code]++
	if code == http.StatusOK {
		s.items[r.URL.Path] += int64(items)
	}
	s.mu.Unlock()
	w.WriteHeader(code)
}

func (s *patternServer) unmarshal(p, j func([]byte) error, b []byte) error {
	if s.json {
		return j(b)
	}
	return p(b)
}

func TestRunHTTPPattern(t *testing.T) {
	for _, tc := range []struct {
		name       string
		json, gzip bool
	}{{"proto", false, false}, {"json+gzip", true, true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := &patternServer{t: t, answered: map[string]map[int]int64{}, items: map[string]int64{}, json: tc.json, gzip: tc.gzip}
			ts := httptest.NewServer(srv)
			defer ts.Close()
			csvPath := filepath.Join(t.TempDir(), "run.csv")
			args := []string{
				"-target", ts.URL, "-signals", "traces:2,metrics:1,logs:1", "-d", "300ms",
				"-warmup-c", "2", "-c", "8", "-warmup-spans", "3", "-burst-spans", "5", "-bigpayload-spans", "7",
				"-attr-size", "16", "-H", "X-Tenant: a", "-csv", csvPath,
			}
			if tc.json {
				args = append(args, "-encoding", "json")
			}
			if tc.gzip {
				args = append(args, "-gzip")
			}
			cfg, err := ParseFlags(args, io.Discard)
			require.NoError(t, err)
			r, err := New(cfg)
			require.NoError(t, err)
			var out bytes.Buffer
			rep, err := r.Run(context.Background(), &out)
			require.NoError(t, err)
			t.Log(out.String())
			require.Len(t, rep.Phases, 3)

			var total Counts
			perSignal := map[Signal]Counts{}
			for _, p := range rep.Phases {
				assert.Equal(t, p.Total.Sent, p.Total.Done(), p.Phase.Name)
				assert.Zero(t, p.Total.Errors+p.Total.Other+p.Total.Unavailable+p.Total.Skipped, p.Phase.Name)
				assert.Equal(t, p.Total.OK*int64(p.Phase.Items), p.Total.AcceptedItems, p.Phase.Name)
				assert.Equal(t, p.Total.OK, p.Codes[200])
				assert.Equal(t, p.Total.Rejected, p.Codes[429])
				total.Add(p.Total)
				for s, c := range p.PerSignal {
					pc := perSignal[s]
					pc.Add(c)
					perSignal[s] = pc
				}
			}
			// Exact: the client saw what the server answered, signal by signal.
			require.Positive(t, total.Sent)
			assert.Equal(t, srv.n.Load(), total.Sent)
			assert.Equal(t, srv.n.Load()/3, total.Rejected)
			for s, c := range perSignal {
				path := s.httpPath()
				assert.Equal(t, srv.answered[path][200], c.OK, path)
				assert.Equal(t, srv.answered[path][429], c.Rejected, path)
				assert.Equal(t, srv.items[path], c.AcceptedItems, path)
			}
			// The mix: traces twice as many as metrics or logs, within one cycle per worker.
			assert.InDelta(t, 2*perSignal[Metrics].Sent, perSignal[Traces].Sent, 2*8+2)
			snap := r.Snapshot()
			assert.Equal(t, total, snap.Total)
			assert.Zero(t, snap.Inflight)

			// The per-second CSV adds up to the same totals.
			f, err := os.Open(csvPath)
			require.NoError(t, err)
			defer f.Close()
			rows, err := csv.NewReader(f).ReadAll()
			require.NoError(t, err)
			require.Equal(t, CSVHeader, rows[0])
			var sent, ok, rej, items int64
			for _, row := range rows[1:] {
				sent += atoi(t, row[4])
				ok += atoi(t, row[5])
				rej += atoi(t, row[6])
				items += atoi(t, row[12])
			}
			assert.Equal(t, []int64{total.Sent, total.OK, total.Rejected, total.AcceptedItems}, []int64{sent, ok, rej, items})
		})
	}
}

func atoi(t *testing.T, s string) int64 {
	v, err := strconv.ParseInt(s, 10, 64)
	require.NoError(t, err)
	return v
}

// TestRunOpenLoopCap: requests due while max-inflight are unanswered are
// skipped, not queued and not sent.
func TestRunOpenLoopCap(t *testing.T) {
	release := make(chan struct{})
	var got atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got.Add(1)
		<-release
		w.WriteHeader(http.StatusOK)
	}))
	defer ts.Close()
	cfg, err := ParseFlags([]string{
		"-target", ts.URL, "-phases", "burst", "-d", "400ms", "-rate", "200",
		"-max-inflight", "2", "-burst-spans", "1",
	}, io.Discard)
	require.NoError(t, err)
	r, err := New(cfg)
	require.NoError(t, err)
	done := make(chan *Report)
	go func() {
		rep, err := r.Run(context.Background(), io.Discard)
		assert.NoError(t, err)
		done <- rep
	}()
	// While the server holds both requests, nothing more is sent: every
	// request due is skipped.
	var blocked Snapshot
	require.Eventually(t, func() bool {
		blocked = r.Snapshot()
		return blocked.Total.Skipped >= 5
	}, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, int64(2), blocked.Total.Sent)
	assert.Equal(t, int64(2), blocked.Inflight)
	assert.LessOrEqual(t, got.Load(), int64(2))
	close(release)
	rep := <-done
	c := rep.Phases[0].Total
	assert.Equal(t, c.Sent, c.OK)
	assert.Equal(t, c.Sent, got.Load())
	assert.GreaterOrEqual(t, c.Skipped, int64(5))
}

// TestRunTransportErrors: a target where nothing listens gives errors, not
// statuses, and the run still ends by itself.
func TestRunTransportErrors(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	cfg, err := ParseFlags([]string{"-target", "http://" + addr, "-phases", "warmup", "-d", "100ms"}, io.Discard)
	require.NoError(t, err)
	r, err := New(cfg)
	require.NoError(t, err)
	rep, err := r.Run(context.Background(), io.Discard)
	require.NoError(t, err)
	c := rep.Phases[0].Total
	assert.Positive(t, c.Errors)
	assert.Equal(t, c.Sent, c.Errors)
	assert.Equal(t, c.Errors, rep.Phases[0].Codes[0])
}

// otlpServer is a real OTLP gRPC server: every fourth call of any service is
// answered RESOURCE_EXHAUSTED, traces report one rejected span as a partial
// success.
type otlpServer struct {
	ptraceotlp.UnimplementedGRPCServer
	n     atomic.Int64
	mu    sync.Mutex
	codes map[string]map[codes.Code]int64
	items map[string]int64
	t     *testing.T
}

func (s *otlpServer) answer(ctx context.Context, svc string, items int) error {
	md, _ := metadata.FromIncomingContext(ctx)
	assert.Equal(s.t, []string{"a"}, md.Get("x-tenant"))
	code := codes.OK
	if s.n.Add(1)%4 == 0 {
		code = codes.ResourceExhausted
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.codes[svc] == nil {
		s.codes[svc] = map[codes.Code]int64{}
	}
	s.codes[svc][code]++
	if code != codes.OK {
		return status.Error(code, "overloaded")
	}
	s.items[svc] += int64(items)
	return nil
}

func (s *otlpServer) Export(ctx context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	if err := s.answer(ctx, "traces", req.Traces().SpanCount()-1); err != nil {
		return ptraceotlp.NewExportResponse(), err
	}
	resp := ptraceotlp.NewExportResponse()
	resp.PartialSuccess().SetRejectedSpans(1)
	return resp, nil
}

type metricsServer struct {
	pmetricotlp.UnimplementedGRPCServer
	s *otlpServer
}

func (m metricsServer) Export(ctx context.Context, req pmetricotlp.ExportRequest) (pmetricotlp.ExportResponse, error) {
	return pmetricotlp.NewExportResponse(), m.s.answer(ctx, "metrics", req.Metrics().DataPointCount())
}

type logsServer struct {
	plogotlp.UnimplementedGRPCServer
	s *otlpServer
}

func (l logsServer) Export(ctx context.Context, req plogotlp.ExportRequest) (plogotlp.ExportResponse, error) {
	return plogotlp.NewExportResponse(), l.s.answer(ctx, "logs", req.Logs().LogRecordCount())
}

func TestRunGRPC(t *testing.T) {
	for _, gz := range []bool{false, true} {
		t.Run("gzip="+strconv.FormatBool(gz), func(t *testing.T) {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			srv := grpc.NewServer()
			o := &otlpServer{t: t, codes: map[string]map[codes.Code]int64{}, items: map[string]int64{}}
			ptraceotlp.RegisterGRPCServer(srv, o)
			pmetricotlp.RegisterGRPCServer(srv, &metricsServer{s: o})
			plogotlp.RegisterGRPCServer(srv, &logsServer{s: o})
			go func() { _ = srv.Serve(l) }()
			defer srv.Stop()

			args := []string{
				"-protocol", "grpc", "-target", l.Addr().String(), "-signals", "traces,metrics,logs",
				"-phases", "warmup,burst", "-d", "300ms", "-c", "6", "-warmup-spans", "4", "-burst-spans", "9",
				"-attr-size", "8", "-H", "X-Tenant: a", "-grpc-conns", "2",
			}
			if gz {
				args = append(args, "-gzip")
			}
			cfg, err := ParseFlags(args, io.Discard)
			require.NoError(t, err)
			r, err := New(cfg)
			require.NoError(t, err)
			var out bytes.Buffer
			rep, err := r.Run(context.Background(), &out)
			require.NoError(t, err)
			t.Log(out.String())
			assert.Contains(t, out.String(), "RESOURCE_EXHAUSTED")

			var total Counts
			per := map[Signal]Counts{}
			for _, p := range rep.Phases {
				assert.Equal(t, p.Total.Sent, p.Total.Done())
				assert.Zero(t, p.Total.Errors+p.Total.Other+p.Total.Unavailable)
				assert.Equal(t, p.Total.OK, p.Codes[int(codes.OK)])
				assert.Equal(t, p.Total.Rejected, p.Codes[int(codes.ResourceExhausted)])
				total.Add(p.Total)
				for s, c := range p.PerSignal {
					pc := per[s]
					pc.Add(c)
					per[s] = pc
				}
			}
			require.Positive(t, total.Sent)
			assert.Equal(t, o.n.Load(), total.Sent)
			assert.Equal(t, o.n.Load()/4, total.Rejected)
			for s, c := range per {
				assert.Equal(t, o.codes[s.String()][codes.OK], c.OK, s)
				assert.Equal(t, o.codes[s.String()][codes.ResourceExhausted], c.Rejected, s)
				assert.Equal(t, o.items[s.String()], c.AcceptedItems, s) // traces: partial success counted
			}
		})
	}
}

// TestRunInterrupted: cancelling the context ends the run early.
func TestRunInterrupted(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer ts.Close()
	cfg, err := ParseFlags([]string{"-target", ts.URL, "-d", "1h", "-c", "2"}, io.Discard)
	require.NoError(t, err)
	r, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		assert.Eventually(t, func() bool { return r.Snapshot().Total.OK > 10 }, 10*time.Second, time.Millisecond)
		cancel()
	}()
	rep, err := r.Run(ctx, io.Discard)
	require.ErrorIs(t, err, context.Canceled)
	require.Len(t, rep.Phases, 1)
	assert.Positive(t, rep.Phases[0].Total.OK)
}

func BenchmarkSendHTTP(b *testing.B) {
	ts := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}))
	defer ts.Close()
	cfg, err := ParseFlags([]string{"-target", ts.URL}, io.Discard)
	require.NoError(b, err)
	r, err := New(cfg)
	require.NoError(b, err)
	defer r.snd.close()
	p, err := BuildPayload(Traces, 500, 256, Proto, false)
	require.NoError(b, err)
	b.SetBytes(int64(len(p.Body)))
	b.ReportAllocs()
	for b.Loop() {
		if res := r.snd.send(context.Background(), p); res.Class != ClassOK {
			b.Fatal(res)
		}
	}
}

// Resource attributes go into the resource of every request's items, of
// every signal, beside the generator's own.
func TestResourceAttributes(t *testing.T) {
	sigs, err := ParseSignals("traces,metrics,logs")
	require.NoError(t, err)
	r, err := New(Config{
		Target: "http://127.0.0.1:9", Protocol: HTTP, Signals: sigs, Timeout: time.Second,
		Resource: map[string]string{"tenant": "tenant-4"},
		Phases:   []Phase{{Name: "p", Duration: time.Second, Rate: 1, MaxInflight: 1, Items: 3}},
	})
	require.NoError(t, err)
	defer r.snd.close()
	for _, p := range r.Payloads() {
		var res pcommon.Map
		switch p.Signal {
		case Traces:
			req := ptraceotlp.NewExportRequest()
			require.NoError(t, req.UnmarshalProto(p.Proto))
			res = req.Traces().ResourceSpans().At(0).Resource().Attributes()
		case Metrics:
			req := pmetricotlp.NewExportRequest()
			require.NoError(t, req.UnmarshalProto(p.Proto))
			res = req.Metrics().ResourceMetrics().At(0).Resource().Attributes()
		case Logs:
			req := plogotlp.NewExportRequest()
			require.NoError(t, req.UnmarshalProto(p.Proto))
			res = req.Logs().ResourceLogs().At(0).Resource().Attributes()
		}
		v, ok := res.Get("tenant")
		require.True(t, ok, p.Signal.String())
		assert.Equal(t, "tenant-4", v.Str())
		_, ok = res.Get("service.name")
		assert.True(t, ok, "the generator's own attributes stay")
	}
	plain, err := BuildPayload(Traces, 3, 0, Proto, false)
	require.NoError(t, err)
	req := ptraceotlp.NewExportRequest()
	require.NoError(t, req.UnmarshalProto(plain.Proto))
	_, ok := req.Traces().ResourceSpans().At(0).Resource().Attributes().Get("tenant")
	assert.False(t, ok, "none unless asked for")
}
