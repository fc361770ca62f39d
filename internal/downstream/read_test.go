// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package downstream

import (
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

// serveBody serves body (a function of nothing) at /metrics.
func serveBody(t *testing.T, body func(w io.Writer)) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { body(w) }))
	t.Cleanup(srv.Close)
	return srv.URL + "/metrics"
}

func meterFor(endpoint string) *Meter {
	cfg := DefaultConfig()
	cfg.Enabled, cfg.Endpoint, cfg.Interval = true, endpoint, minInterval
	return New(cfg, Options{})
}

// TestFullestSkipsWhatIsNoCount: a NaN size is no queue; compared with it
// every fill would lose, and a full queue of another exporter would hide
// behind it.
func TestFullestSkipsWhatIsNoCount(t *testing.T) {
	queues, err := parseQueues(strings.NewReader(`otelcol_exporter_queue_size{data_type="traces",exporter="odd"} NaN
otelcol_exporter_queue_capacity{data_type="traces",exporter="odd"} 100
otelcol_exporter_queue_size{data_type="traces",exporter="backend"} 95
otelcol_exporter_queue_capacity{data_type="traces",exporter="backend"} 100
`))
	require.NoError(t, err)
	q, err := meterFor(DefaultEndpoint).fullest(queues)
	require.NoError(t, err)
	assert.Equal(t, "backend", q.Exporter)
	assert.InDelta(t, 0.95, q.Fill(), 1e-9)
}

// TestReadFailsOnABodyTooLarge: a body cut at maxBody fails the read; read
// as complete, its last line's number cut short reads 95 % as 9 %.
func TestReadFailsOnABodyTooLarge(t *testing.T) {
	head := "otelcol_exporter_queue_capacity{data_type=\"traces\",exporter=\"a\"} 100\n"
	size := "otelcol_exporter_queue_size{data_type=\"traces\",exporter=\"a\"} 9"
	// Comment lines of other metrics up to maxBody, minus what the two
	// queue lines take, so that the cut falls right after the "9" of "95".
	filler := maxBody - len(head) - len(size)
	endpoint := serveBody(t, func(w io.Writer) {
		_, _ = io.WriteString(w, head)
		line := "# HELP other_metric " + strings.Repeat("x", 1000) + "\n"
		for filler > 0 {
			n := min(filler, len(line))
			if n < len(line) {
				_, _ = io.WriteString(w, strings.Repeat("#", n-1)+"\n")
			} else {
				_, _ = io.WriteString(w, line)
			}
			filler -= n
		}
		_, _ = io.WriteString(w, size+"5\n")
	})
	_, err := meterFor(endpoint).read(context.Background())
	require.ErrorIs(t, err, errTooLarge)
}

// TestReadSkipsALongLineOfAnotherMetric: one line past the buffer (a
// target_info with long labels) is skipped, not the whole read.
func TestReadSkipsALongLineOfAnotherMetric(t *testing.T) {
	endpoint := serveBody(t, func(w io.Writer) {
		_, _ = fmt.Fprintf(w, "target_info{service_name=\"c\",k8s_pod_labels=%q} 1\n", strings.Repeat("l", maxLine))
		_, _ = io.WriteString(w, "otelcol_exporter_queue_size{data_type=\"traces\",exporter=\"a\"} 95\n")
		_, _ = io.WriteString(w, "otelcol_exporter_queue_capacity{data_type=\"traces\",exporter=\"a\"} 100\n")
	})
	q, err := meterFor(endpoint).read(context.Background())
	require.NoError(t, err)
	assert.InDelta(t, 0.95, q.Fill(), 1e-9)
}

// TestStopClosesTheConnection: the kept connection and its goroutines go
// with the meter (a configuration reload builds a new one).
func TestStopClosesTheConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "otelcol_exporter_queue_size{data_type=\"traces\",exporter=\"a\"} 5\n")
		_, _ = io.WriteString(w, "otelcol_exporter_queue_capacity{data_type=\"traces\",exporter=\"a\"} 100\n")
	}))
	defer srv.Close() // after the check: the collector's endpoint outlives the extension
	// The server's side of the connection is the collector's, not the meter's.
	ignore := []goleak.Option{goleak.IgnoreCurrent(), goleak.IgnoreAnyFunction("net/http.(*conn).serve")}
	m := meterFor(srv.URL + "/metrics")
	m.Start()
	require.Eventually(t, func() bool { return m.Read(nil).Valid }, 5*time.Second, 5*time.Millisecond)
	m.Stop()
	assert.NoError(t, goleak.Find(ignore...))
}

// TestReadGzipUnasked: an endpoint that compresses unasked is still read.
func TestReadGzipUnasked(t *testing.T) {
	endpoint := serveBody(t, func(w io.Writer) {
		rw := w.(http.ResponseWriter)
		rw.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		_, _ = io.WriteString(zw, "otelcol_exporter_queue_size{data_type=\"traces\",exporter=\"a\"} 40\n")
		_, _ = io.WriteString(zw, "otelcol_exporter_queue_capacity{data_type=\"traces\",exporter=\"a\"} 100\n")
		_ = zw.Close()
	})
	q, err := meterFor(endpoint).read(context.Background())
	require.NoError(t, err)
	assert.InDelta(t, 0.4, q.Fill(), 1e-9)
}

// TestParseOpenMetrics: an OpenMetrics body (# EOF, spaces and a trailing
// comma in the labels, a timestamp) is read.
func TestParseOpenMetrics(t *testing.T) {
	queues, err := parseQueues(strings.NewReader(`# TYPE otelcol_exporter_queue_size gauge
otelcol_exporter_queue_size{data_type="traces", exporter="a"} 40 1700000000.123
otelcol_exporter_queue_capacity{data_type="traces",exporter="a",} 100
# EOF
`))
	require.NoError(t, err)
	require.Len(t, queues, 1)
	assert.InDelta(t, 0.4, queues[0].Fill(), 1e-9)
}

// TestStopDuringATricklingBody: a body that never ends does not hold Stop
// (the read's own timeout is 10 s at this interval).
func TestStopDuringATricklingBody(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for {
			_, _ = io.WriteString(w, "# x\n")
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}))
	defer srv.Close()
	defer close(stop)
	cfg := DefaultConfig()
	cfg.Enabled, cfg.Endpoint, cfg.Interval = true, srv.URL, maxInterval // a 10 s read timeout
	m := New(cfg, Options{})
	m.Start()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	m.Stop()
	assert.Less(t, time.Since(start), 5*time.Second)
}

// TestReadAsksForNoCompression: the collector would gzip its whole
// exposition at every read for a reader beside it.
func TestReadAsksForNoCompression(t *testing.T) {
	asked := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case asked <- r.Header.Get("Accept-Encoding"):
		default:
		}
		_, _ = io.WriteString(w, "otelcol_exporter_queue_size{data_type=\"traces\",exporter=\"a\"} 5\n")
		_, _ = io.WriteString(w, "otelcol_exporter_queue_capacity{data_type=\"traces\",exporter=\"a\"} 100\n")
	}))
	defer srv.Close()
	_, err := meterFor(srv.URL + "/metrics").read(context.Background())
	require.NoError(t, err)
	assert.NotContains(t, <-asked, "gzip")
}
