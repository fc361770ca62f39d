// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build e2e

package distribution

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"

	"github.com/otelthrottle/throttle/testbed/test/internal/e2e"
)

const (
	// startTimeout bounds the time from exec to a healthy collector.
	startTimeout = 60 * time.Second
	// stopTimeout bounds a graceful shutdown after SIGTERM.
	stopTimeout = 30 * time.Second
)

// TestValidateExamples runs `otelcol-throttle validate` on every example
// config users are pointed at, and on the smoke test's own config.
func TestValidateExamples(t *testing.T) {
	bin := distribution(t)
	root, err := repoRoot()
	require.NoError(t, err)

	examples, err := filepath.Glob(filepath.Join(root, "examples", "*.yaml"))
	require.NoError(t, err)
	require.NotEmpty(t, examples, "no examples/*.yaml to validate")
	configs := append([]string(nil), examples...)
	configs = append(configs, e2e.RenderFile(t, filepath.Join("testdata", "smoke-config.yaml.tmpl"), e2e.FreePorts(t)))

	for _, cfg := range configs {
		t.Run(filepath.Base(cfg), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, bin, "validate", "--config", cfg).CombinedOutput()
			require.NoError(t, err, "validate --config %s:\n%s", cfg, out)
		})
	}
}

// TestInvalidThresholdIsRefused: a config with cpu.exit above
// enter must be refused by `validate` and by a plain start, with a non-zero
// exit status and the field named on stderr.
func TestInvalidThresholdIsRefused(t *testing.T) {
	bin := distribution(t)
	cfg := e2e.RenderFile(t, filepath.Join("testdata", "invalid-threshold.yaml.tmpl"), e2e.FreePorts(t))

	t.Run("validate", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
		defer cancel()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, bin, "validate", "--config", cfg)
		cmd.Stderr = &stderr
		err := cmd.Run()
		var exitErr *exec.ExitError
		require.ErrorAs(t, err, &exitErr, "validate must fail; stderr:\n%s", stderr.String())
		assert.NotZero(t, exitErr.ExitCode())
		assert.Contains(t, stderr.String(), "cpu: exit must be < enter")
	})

	t.Run("run", func(t *testing.T) {
		col := start(t, bin, "--config", cfg)
		code, err := col.wait(stopTimeout)
		require.NoError(t, err, "stderr:\n%s", col.stderr.String())
		assert.NotZero(t, code, "the collector must refuse to start; stderr:\n%s", col.stderr.String())
		assert.Contains(t, col.stderr.String(), "cpu: exit must be < enter")
	})
}

// TestRunAcceptsOTLP starts the distribution with throttle on both OTLP
// protocols and the throttle processor in the traces and logs pipelines,
// sends OTLP over HTTP and gRPC, checks every request is accepted and reaches
// the debug exporter, finds the throttle series on the collector's own
// metrics endpoint, and stops the collector with SIGTERM.
func TestRunAcceptsOTLP(t *testing.T) {
	bin := distribution(t)
	ports := e2e.FreePorts(t)
	cfg := e2e.RenderFile(t, filepath.Join("testdata", "smoke-config.yaml.tmpl"), ports)
	col := start(t, bin, "--config", cfg)

	healthURL := fmt.Sprintf("http://127.0.0.1:%d/", ports.HealthPort)
	metricsURL := fmt.Sprintf("http://127.0.0.1:%d/metrics", ports.MetricsPort)
	httpAddr := fmt.Sprintf("127.0.0.1:%d", ports.HTTPPort)
	grpcAddr := fmt.Sprintf("127.0.0.1:%d", ports.GRPCPort)

	// Ready when the health check answers 200 (after every pipeline started).
	col.eventually(t, startTimeout, "the health check to answer 200", func() bool {
		code, _, err := e2e.Get(t.Context(), healthURL)
		return err == nil && code == 200
	})

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// OTLP/HTTP, protobuf: traces (3 spans) and metrics.
	code, body, err := e2e.PostTraces(ctx, httpAddr, e2e.Traces(3))
	require.NoError(t, err)
	require.Equal(t, 200, code, "POST /v1/traces: %s", body)
	resp := ptraceotlp.NewExportResponse()
	require.NoError(t, resp.UnmarshalProto(body))
	assert.Zero(t, resp.PartialSuccess().RejectedSpans())

	code, body, err = e2e.PostMetrics(ctx, httpAddr, e2e.Metrics(2))
	require.NoError(t, err)
	require.Equal(t, 200, code, "POST /v1/metrics: %s", body)

	// OTLP/gRPC: traces (5 spans) and logs.
	client, err := e2e.DialGRPC(grpcAddr)
	require.NoError(t, err)
	defer client.Close()
	tr, err := client.ExportTraces(ctx, e2e.Traces(5))
	require.NoError(t, err, "gRPC TraceService/Export")
	assert.Zero(t, tr.PartialSuccess().RejectedSpans())
	_, err = client.ExportLogs(ctx, e2e.Logs(4))
	require.NoError(t, err, "gRPC LogsService/Export")

	// Both trace requests went through the pipeline (throttle processor
	// included) to the debug exporter, which logs one line per batch.
	col.eventually(t, 10*time.Second, "the debug exporter to log both trace batches", func() bool {
		s := col.stderr.String()
		return strings.Contains(s, `"spans": 3`) && strings.Contains(s, `"spans": 5`)
	})

	// The throttle series on the collector's own Prometheus endpoint: the
	// extension's decisions per protocol and the processor's items.
	var samples []e2e.Sample
	col.eventually(t, 10*time.Second, "otelcol_throttle_* series on "+metricsURL, func() bool {
		code, text, err := e2e.Get(t.Context(), metricsURL)
		if err != nil || code != 200 {
			return false
		}
		samples, err = e2e.ParseExposition(text)
		require.NoError(t, err, "the collector's own metrics")
		return len(e2e.Names(samples, "otelcol_throttle_")) > 0
	})
	t.Logf("throttle series: %v", e2e.Names(samples, "otelcol_throttle_"))
	assertDecisions(t, col, metricsURL)

	// The throttle status page answers on its own endpoint.
	code, statusJSON, err := e2e.Get(ctx, fmt.Sprintf("http://127.0.0.1:%d/status", ports.StatusPort))
	require.NoError(t, err)
	assert.Equal(t, 200, code, "GET /status: %s", statusJSON)
	assert.Contains(t, statusJSON, "traces", "GET /status names the signals")

	// Clean stop.
	require.NoError(t, col.cmd.Process.Signal(syscall.SIGTERM))
	code, err = col.wait(stopTimeout)
	require.NoError(t, err, "stderr:\n%s", tail(col.stderr.String(), 40))
	assert.Zero(t, code, "exit status after SIGTERM; stderr:\n%s", tail(col.stderr.String(), 40))
}

// assertDecisions checks the extension counted the admitted requests of
// each protocol and the processor counted the items it passed.
func assertDecisions(t *testing.T, col *collector, metricsURL string) {
	t.Helper()
	var samples []e2e.Sample
	ok := col.poll(10*time.Second, func() bool {
		_, text, err := e2e.Get(t.Context(), metricsURL)
		if err != nil {
			return false
		}
		samples, err = e2e.ParseExposition(text)
		require.NoError(t, err, "the collector's own metrics")
		httpN, _ := e2e.Sum(samples, "otelcol_throttle_requests", map[string]string{"protocol": "http", "decision": "allowed"})
		grpcN, _ := e2e.Sum(samples, "otelcol_throttle_requests", map[string]string{"protocol": "grpc", "decision": "allowed"})
		items, _ := e2e.Sum(samples, "otelcol_processor_throttle_items", map[string]string{"signal": "traces", "outcome": "passed"})
		return httpN >= 2 && grpcN >= 2 && items >= 8
	})
	assert.True(t, ok, "want otelcol_throttle_requests allowed >= 2 for protocol http and grpc, and otelcol_processor_throttle_items{signal=traces,outcome=passed} >= 8; got:\n%s%s",
		e2e.Describe(samples, "otelcol_throttle_"), e2e.Describe(samples, "otelcol_processor_throttle_"))
}

// collector is one otelcol-throttle process started by a test. Only this
// process is ever signalled or killed.
type collector struct {
	cmd     *exec.Cmd
	stderr  *syncBuffer
	done    chan struct{}
	waitErr error
}

func start(t *testing.T, bin string, args ...string) *collector {
	t.Helper()
	c := &collector{cmd: exec.Command(bin, args...), stderr: &syncBuffer{}, done: make(chan struct{})}
	c.cmd.Stdout = c.stderr
	c.cmd.Stderr = c.stderr
	c.cmd.WaitDelay = 5 * time.Second
	require.NoError(t, c.cmd.Start())
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		select {
		case <-c.done:
		default:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
		if t.Failed() {
			t.Logf("collector output:\n%s", tail(c.stderr.String(), 80))
		}
	})
	return c
}

// wait returns the exit status, or errExitTimeout when the process is still
// running after d.
func (c *collector) wait(d time.Duration) (int, error) {
	select {
	case <-c.done:
	case <-time.After(d):
		return -1, errExitTimeout
	}
	var exitErr *exec.ExitError
	switch {
	case c.waitErr == nil:
		return 0, nil
	case errors.As(c.waitErr, &exitErr):
		return exitErr.ExitCode(), nil
	default:
		return -1, c.waitErr
	}
}

// poll calls cond every 100ms until it holds, the process exits, or d passes.
func (c *collector) poll(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for {
		if cond() {
			return true
		}
		select {
		case <-c.done:
			return false
		default:
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// eventually is poll that fails the test, saying whether the collector died.
func (c *collector) eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if c.poll(d, cond) {
		return
	}
	select {
	case <-c.done:
		t.Fatalf("collector exited (%v) while waiting for %s", c.waitErr, what)
	default:
		t.Fatalf("timed out after %s waiting for %s", d, what)
	}
}

// syncBuffer is a bytes.Buffer safe for the process's writes and the test's
// reads.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
