// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package distribution

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"google.golang.org/grpc"

	"github.com/otelthrottle/throttle/testbed/test/internal/e2e"
)

// backend is an OTLP/gRPC trace backend that the test can hang: while hung,
// an Export waits until the backend resumes or its caller gives up, and
// only a completed Export counts its spans.
type backend struct {
	ptraceotlp.UnimplementedGRPCServer
	mu      sync.Mutex
	resumed chan struct{} // closed while the backend answers
	spans   atomic.Int64
}

func newBackend() *backend {
	b := &backend{resumed: make(chan struct{})}
	close(b.resumed)
	return b
}

func (b *backend) hang() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.resumed = make(chan struct{})
}

func (b *backend) resume() {
	b.mu.Lock()
	defer b.mu.Unlock()
	close(b.resumed)
}

func (b *backend) Export(ctx context.Context, req ptraceotlp.ExportRequest) (ptraceotlp.ExportResponse, error) {
	b.mu.Lock()
	resumed := b.resumed
	b.mu.Unlock()
	select {
	case <-resumed:
	case <-ctx.Done():
		return ptraceotlp.NewExportResponse(), ctx.Err()
	}
	if err := ctx.Err(); err != nil { // the exporter gave up: it sends this again
		return ptraceotlp.NewExportResponse(), err
	}
	b.spans.Add(int64(req.Traces().SpanCount()))
	return ptraceotlp.NewExportResponse(), nil
}

// TestDownstreamRefusesBeforeTheQueueIsFull: the backend hangs, the
// exporter's queue fills, and the throttle refuses at the receiver's
// entrance (429 with Retry-After) before the queue refuses anything
// (otelcol_exporter_enqueue_failed_spans stays 0); once the backend
// resumes, the queue drains, the receiver admits again, and every span the
// receiver accepted reaches the backend.
func TestDownstreamRefusesBeforeTheQueueIsFull(t *testing.T) {
	bin := distribution(t)
	be := newBackend()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := grpc.NewServer()
	ptraceotlp.RegisterGRPCServer(srv, be)
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	t.Cleanup(func() {
		select { // an Export still hung would hold srv.Stop
		case <-be.resumed:
		default:
			be.resume()
		}
	})

	ports := struct {
		e2e.Ports
		BackendPort int
	}{e2e.FreePorts(t), lis.Addr().(*net.TCPAddr).Port}
	cfg := e2e.RenderFile(t, filepath.Join("testdata", "downstream-config.yaml.tmpl"), ports)
	col := start(t, bin, "--config", cfg)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", ports.HTTPPort)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports.MetricsPort)
	col.eventually(t, startTimeout, "the health check to answer 200", func() bool {
		code, _, err := e2e.Get(t.Context(), fmt.Sprintf("http://127.0.0.1:%d/", ports.HealthPort))
		return err == nil && code == 200
	})

	const spansPerRequest = 10
	var accepted, refused int
	send := func() int {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		body, err := ptraceotlp.NewExportRequestFromTraces(e2e.Traces(spansPerRequest)).MarshalProto()
		require.NoError(t, err)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+httpAddr+"/v1/traces", bytes.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/x-protobuf")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			accepted++
		case http.StatusTooManyRequests:
			refused++
			assert.NotEmpty(t, resp.Header.Get("Retry-After"), "a refusal carries a retry hint")
		default:
			t.Fatalf("POST /v1/traces: %d", resp.StatusCode)
		}
		return resp.StatusCode
	}

	// The backend answers: everything is admitted.
	for range 10 {
		require.Equal(t, 200, send())
	}

	// The backend hangs: ten requests a second fill the queue of 50 in
	// about five seconds; the throttle sheds from half full and refuses
	// everything from 80% on (Open), until ten refusals in a row.
	be.hang()
	consecutive := 0
	var samples []e2e.Sample
	var state, level float64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "not Open with ten refusals in a row in 30s with the backend hung (accepted %d, refused %d, state %v, level %v)", accepted, refused, state, level)
		if send() != http.StatusTooManyRequests {
			consecutive = 0
			continue
		}
		consecutive++
		if consecutive < 10 {
			continue
		}
		samples = scrape(t, metricsURL)
		state, _ = e2e.Sum(samples, "otelcol_throttle_state", map[string]string{"signal": "traces"})
		level, _ = e2e.Sum(samples, "otelcol_throttle_water_level", map[string]string{"kind": "downstream"})
		if state == 2 { // Open
			break
		}
	}
	failed, _ := e2e.Sum(samples, "otelcol_exporter_enqueue_failed_spans", nil)
	assert.Zero(t, failed, "the queue refused spans the receiver had decoded")
	assert.GreaterOrEqual(t, level, 0.8, "Open at the hard line")
	t.Logf("backend hung: accepted %d, refused %d, queue %.0f%% full", accepted, refused, 100*level)
	code, status, err := e2e.Get(t.Context(), fmt.Sprintf("http://127.0.0.1:%d/status", ports.StatusPort))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, code)
	assert.Contains(t, status, `"downstream"`, "the status page shows the downstream level and its lines")

	// The backend resumes: the queue drains and the receiver admits again.
	be.resume()
	for deadline := time.Now().Add(30 * time.Second); send() != 200; time.Sleep(100 * time.Millisecond) {
		require.True(t, time.Now().Before(deadline), "still refused 30s after the backend resumed")
	}
	want := int64(accepted * spansPerRequest)
	col.eventually(t, 30*time.Second, "every accepted span at the backend", func() bool { return be.spans.Load() >= want })
	failed, _ = e2e.Sum(scrape(t, metricsURL), "otelcol_exporter_enqueue_failed_spans", nil)
	assert.Zero(t, failed, "the queue refused spans the receiver had decoded")

	require.NoError(t, col.cmd.Process.Signal(syscall.SIGTERM))
	code, err = col.wait(stopTimeout)
	require.NoError(t, err)
	assert.Zero(t, code)
}

// scrape reads the collector's own metrics.
func scrape(t *testing.T, url string) []e2e.Sample {
	t.Helper()
	code, text, err := e2e.Get(t.Context(), url)
	require.NoError(t, err)
	require.Equal(t, 200, code)
	samples, err := e2e.ParseExposition(text)
	require.NoError(t, err)
	return samples
}
