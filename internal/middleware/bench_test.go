// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/tap"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
)

// nopWriter is a reusable ResponseWriter: httptest.NewRecorder allocates,
// which would hide the middleware's own cost.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(int)             {}
func (w *nopWriter) Flush()                      {} // as net/http's own writer

var sinkInt int

// constDecider is the cheapest possible Decider, so the benchmarks measure
// the middleware rather than the test double (the engine's Pressure is one
// atomic load).
type constDecider decision.Verdict

func (c constDecider) Pressure(decision.Signal) (bool, float64) {
	switch decision.Verdict(c) {
	case decision.VerdictDenyOpen:
		return true, 0
	case decision.VerdictDenyShed:
		return false, 1
	}
	return false, 0
}
func (constDecider) Exempt(decision.Signal) bool { return false }
func (c constDecider) Pressed(decision.Signal) bool {
	return decision.Verdict(c) != decision.VerdictAdmit
}
func (constDecider) Holdable(decision.Signal) bool { return true }

// benchAdmission is an admission deciding v, with a budget of budget bytes
// (0: off), the default share and idle timeout idle.
func benchAdmission(tb testing.TB, v decision.Verdict, budget int64, idle time.Duration) *admission.Controller {
	tb.Helper()
	cfg := admission.NewDefaultConfig()
	cfg.MaxInflightBytes = admission.FixedInflightBudget(admission.ByteSize(budget))
	cfg.IdleTimeout = idle
	adm, err := admission.New(cfg, admission.HoldConfig{}, admission.Settings{
		Decider: constDecider(v), Recorder: &countingRecorder{}, Budget: budget, HeldPool: budget,
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(adm.Close)
	return adm
}

func bareHandler() http.Handler {
	return http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { sinkInt += int(r.ContentLength) })
}

// benchRequest is a body-less request to target from 127.0.0.1.
func benchRequest(target string) *http.Request {
	r := httptest.NewRequest(http.MethodPost, target, http.NoBody)
	r.RemoteAddr = "127.0.0.1:4711"
	r.ContentLength = 1024
	r.Header.Set("Content-Type", "application/x-protobuf")
	return r
}

func BenchmarkHTTPAdmit(b *testing.B) {
	run := func(b *testing.B, h http.Handler, r *http.Request) {
		w := &nopWriter{h: http.Header{}}
		b.ReportAllocs()
		for b.Loop() {
			h.ServeHTTP(w, r)
		}
	}
	wrap := func(b *testing.B, budget int64) http.Handler {
		mw, err := NewHTTP(Config{Classifier: mustClassifier(b, Routes{}), Admission: benchAdmission(b, decision.VerdictAdmit, budget, 0)})
		if err != nil {
			b.Fatal(err)
		}
		return mw.Wrap(bareHandler())
	}
	b.Run("bare", func(b *testing.B) { run(b, bareHandler(), benchRequest("/v1/traces")) })
	b.Run("wrapped", func(b *testing.B) { run(b, wrap(b, 1<<30), benchRequest("/v1/traces")) })
	b.Run("wrapped-no-budget", func(b *testing.B) { run(b, wrap(b, 0), benchRequest("/v1/traces")) })
	b.Run("wrapped-unclassified", func(b *testing.B) { run(b, wrap(b, 1<<30), benchRequest("/health")) })
	b.Run("wrapped-unclean-path", func(b *testing.B) { run(b, wrap(b, 1<<30), benchRequest("//v1/traces/")) })
	b.Run("wrapped-parallel", func(b *testing.B) {
		h := wrap(b, 1<<30)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			r := benchRequest("/v1/traces")
			w := &nopWriter{h: http.Header{}}
			for pb.Next() {
				h.ServeHTTP(w, r)
			}
		})
	})
}

// BenchmarkHTTPAdmitBody is the admit path of a request with a 16 KiB body
// that the handler reads: the body is charged as it is read, and with an
// idle timeout watched by a timer.
func BenchmarkHTTPAdmitBody(b *testing.B) {
	payload := make([]byte, 16<<10)
	readAll := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		sinkInt += int(n)
	})
	run := func(b *testing.B, h http.Handler) {
		body := bytes.NewReader(payload)
		// Without WriteTo, as net/http's request bodies: the handler copies.
		r := httptest.NewRequest(http.MethodPost, "/v1/traces", io.NopCloser(struct{ io.Reader }{body}))
		r.ContentLength = int64(len(payload))
		w := &nopWriter{h: http.Header{}}
		b.ReportAllocs()
		for b.Loop() {
			body.Reset(payload)
			h.ServeHTTP(w, r)
		}
	}
	wrap := func(b *testing.B, idle time.Duration) http.Handler {
		mw, err := NewHTTP(Config{Classifier: mustClassifier(b, Routes{}), Admission: benchAdmission(b, decision.VerdictAdmit, 1<<30, idle)})
		if err != nil {
			b.Fatal(err)
		}
		return mw.Wrap(readAll)
	}
	b.Run("bare", func(b *testing.B) { run(b, readAll) })
	b.Run("wrapped", func(b *testing.B) { run(b, wrap(b, 0)) })
	b.Run("wrapped-idle-timeout", func(b *testing.B) { run(b, wrap(b, admission.DefaultIdleTimeout)) })
	b.Run("wrapped-idle-timeout-parallel", func(b *testing.B) {
		h := wrap(b, admission.DefaultIdleTimeout)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			body := bytes.NewReader(payload)
			r := httptest.NewRequest(http.MethodPost, "/v1/traces", io.NopCloser(struct{ io.Reader }{body}))
			r.ContentLength = int64(len(payload))
			w := &nopWriter{h: http.Header{}}
			for pb.Next() {
				body.Reset(payload)
				h.ServeHTTP(w, r)
			}
		})
	})
}

func BenchmarkHTTPReject(b *testing.B) {
	for _, ct := range []string{"application/x-protobuf", "application/json", "application/x-protobuf; charset=binary"} {
		b.Run(ct, func(b *testing.B) {
			mw, err := NewHTTP(Config{Classifier: mustClassifier(b, Routes{}), Admission: benchAdmission(b, decision.VerdictDenyShed, 0, 0)})
			if err != nil {
				b.Fatal(err)
			}
			h := mw.Wrap(bareHandler())
			r := httptest.NewRequest(http.MethodPost, "/v1/traces", http.NoBody)
			r.Header.Set("Content-Type", ct)
			w := &nopWriter{h: http.Header{}}
			b.ReportAllocs()
			for b.Loop() {
				h.ServeHTTP(w, r)
			}
		})
	}
}

func BenchmarkClassify(b *testing.B) {
	c := mustClassifier(b, Routes{HTTP: map[string]decision.Signal{"/prometheus/write": decision.SignalMetrics}})
	for name, p := range map[string]string{
		"http-clean-match":    "/v1/traces",
		"http-clean-nomatch":  "/health",
		"http-unclean-match":  "//v1/./traces/",
		"http-long-clean":     "/" + strings.Repeat("a", 8192),
		"http-long-unclean":   strings.Repeat("/", 8192) + "v1/traces",
		"http-user-route":     "/prometheus/write",
		"http-profiles-match": "/v1development/profiles",
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, ok := c.HTTP(p)
				if ok {
					sinkInt++
				}
			}
		})
	}
	b.Run("grpc-match", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok := c.GRPC(traceExport); ok {
				sinkInt++
			}
		}
	})
}

// BenchmarkGRPCTap measures the middleware's share of an RPC: the tap and
// the Begin/End events of the stats handler (grpc-go itself spends far more
// per RPC).
func BenchmarkGRPCTap(b *testing.B) {
	run := func(b *testing.B, mw *GRPC, method string) {
		ctx, cancel := context.WithCancel(context.WithValue(context.Background(), peerKey{}, netip.MustParseAddr("127.0.0.1")))
		defer cancel()
		info := &tap.Info{FullMethodName: method}
		h := grpcStats{mw}
		begin, end := &stats.Begin{}, &stats.End{}
		b.ReportAllocs()
		for b.Loop() {
			rctx, err := mw.tap(ctx, info)
			if err == nil {
				h.HandleRPC(rctx, begin)
				h.HandleRPC(rctx, end)
			}
		}
	}
	newMW := func(b *testing.B, adm *admission.Controller) *GRPC {
		mw, err := NewGRPC(Config{Classifier: mustClassifier(b, Routes{}), Admission: adm})
		if err != nil {
			b.Fatal(err)
		}
		return mw
	}
	b.Run("admit-budget", func(b *testing.B) {
		run(b, newMW(b, benchAdmission(b, decision.VerdictAdmit, 1<<40, 0)), traceExport)
	})
	b.Run("admit-budget-idle-timeout", func(b *testing.B) {
		run(b, newMW(b, benchAdmission(b, decision.VerdictAdmit, 1<<40, admission.DefaultIdleTimeout)), traceExport)
	})
	b.Run("admit-no-budget", func(b *testing.B) { run(b, newMW(b, benchAdmission(b, decision.VerdictAdmit, 0, 0)), traceExport) })
	b.Run("unclassified", func(b *testing.B) {
		run(b, newMW(b, benchAdmission(b, decision.VerdictDenyOpen, 1<<40, 0)), "/grpc.health.v1.Health/Check")
	})
	b.Run("reject", func(b *testing.B) {
		run(b, newMW(b, benchAdmission(b, decision.VerdictDenyShed, 1<<40, 0)), traceExport)
	})
	b.Run("reject-budget-full", func(b *testing.B) {
		a := newAdm(b, 1<<20, withUnknownSize(1<<20), withWait(0))
		defer a.reserve(b, "10.255.0.1", decision.SignalLogs, 1<<20)()
		run(b, newMW(b, a.adm), traceExport)
	})
	// The interceptor every RPC passes after the tap admitted it.
	b.Run("gate", func(b *testing.B) {
		mw := newMW(b, benchAdmission(b, decision.VerdictAdmit, 1<<40, 0))
		rctx, err := mw.tap(context.Background(), &tap.Info{FullMethodName: traceExport})
		if err != nil {
			b.Fatal(err)
		}
		handler := func(context.Context, any) (any, error) { return nil, nil }
		b.ReportAllocs()
		for b.Loop() {
			_, _ = mw.unaryGate(rctx, nil, nil, handler)
		}
	})
}

// TestHTTPAdmitAllocs pins the benchmark's claim in a test: deciding and
// admitting a request without a body allocates nothing; one with a body
// allocates its ticket and its body's reader.
func TestHTTPAdmitAllocs(t *testing.T) {
	a := newAdm(t, 1<<30, withDefaultShare())
	mw, err := NewHTTP(Config{Classifier: mustClassifier(t, Routes{}), Admission: a.adm})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(bareHandler())
	r := benchRequest("/v1/traces")
	w := &nopWriter{h: http.Header{}}
	if allocs := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) }); allocs != 0 {
		t.Fatalf("the admit path allocates %v times per request without a body, want 0", allocs)
	}
}

// TestHTTPRejectAllocs: refusing a request allocates no more than writing
// its answer does (the header values): the decision allocates nothing.
func TestHTTPRejectAllocs(t *testing.T) {
	a := newAdm(t, 1<<30, withDefaultShare())
	a.dec.set(decision.SignalTraces, decision.VerdictDenyShed)
	mw, err := NewHTTP(Config{Classifier: mustClassifier(t, Routes{}), Admission: a.adm})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Wrap(bareHandler())
	r := benchRequest("/v1/traces")
	w := &nopWriter{h: http.Header{}}
	answer := testing.AllocsPerRun(1000, func() {
		writeHTTPRejection(w, r, mw.bodies, decision.VerdictDenyShed, time.Second, false)
	})
	if refusal := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) }); refusal != answer {
		t.Fatalf("a refusal allocates %v times, its answer %v", refusal, answer)
	}
}

// BenchmarkHTTPRejectTLS is why a shed rejection over TLS keeps its
// connection: a 200 KiB request refused on a kept connection (net/http
// reads the body) against the same request on a new connection each time
// (a handshake, the body unread). Client and server share the process, so
// compare the two ratios, not the absolute figures.
func BenchmarkHTTPRejectTLS(b *testing.B) {
	mw, err := NewHTTP(Config{Classifier: mustClassifier(b, Routes{}), Admission: benchAdmission(b, decision.VerdictDenyShed, 0, 0)})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewTLSServer(mw.Wrap(bareHandler()))
	defer srv.Close()
	body := make([]byte, 200<<10)
	for _, tc := range []struct {
		name      string
		keepAlive bool
	}{{"kept_connection", true}, {"new_connection", false}} {
		b.Run(tc.name, func(b *testing.B) {
			tr := srv.Client().Transport.(*http.Transport).Clone()
			tr.DisableKeepAlives = !tc.keepAlive
			defer tr.CloseIdleConnections()
			for b.Loop() {
				req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/traces", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				resp, err := tr.RoundTrip(req)
				if err != nil && !tc.keepAlive && (errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)) {
					// Closed before the client wrote the whole body: the
					// refusal's point, so the round trip counts.
					continue
				}
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusTooManyRequests {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
		})
	}
}
