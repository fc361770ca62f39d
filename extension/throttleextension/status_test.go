// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componentstatus"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/extension/extensiontest"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadata"
	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/testutil"
)

// The status tests' source (newStatusTestSource) uses no CPU; the test
// sets its working set against a fixed memory limit.
const (
	statusTestLimit = 1000
	statusTestCalm  = 500 // 0.50: under every memory line
	statusTestOver  = 950 // 0.95: over mem hard (0.92, one check breaches): Open in one sample
)

// newStatusTestSource is a source at statusTestCalm.
func newStatusTestSource() *testutil.Source {
	src := testutil.NewSource(cgroup.Limits{MemLimit: statusTestLimit})
	src.SetWorkingSet(statusTestCalm)
	return src
}

// startStatusExtension creates the extension through its factory with a 10ms
// sample interval and no CPU slot plus the extra keys, and starts it on host.
func startStatusExtension(t *testing.T, host component.Host, extra map[string]any) (*throttleExtension, *testutil.Source) {
	e, src, _ := startStatusExtensionLogged(t, host, extra)
	return e, src
}

// startStatusExtensionLogged is startStatusExtension, with the extension's
// log.
func startStatusExtensionLogged(t *testing.T, host component.Host, extra map[string]any) (*throttleExtension, *testutil.Source, *observer.ObservedLogs) {
	t.Helper()
	src := newStatusTestSource()
	f := newFactory(factoryOptions{source: src})
	cfg := f.CreateDefaultConfig()
	conf := map[string]any{
		"check_interval": "10ms",
		"recovery_ramp":  "0s",
		// A sampler starved under -race must not turn Open into Normal.
		"stale_after": "0s",
		"cpu":         map[string]any{"enabled": false},
	}
	maps.Copy(conf, extra)
	require.NoError(t, confmap.NewFromStringMap(conf).Unmarshal(cfg))
	require.NoError(t, confmap.Validate(cfg))
	set := extensiontest.NewNopSettings(metadata.Type)
	core, logs := observer.New(zapcore.InfoLevel)
	set.Logger = zap.New(core)
	ext, err := f.Create(context.Background(), set, cfg)
	require.NoError(t, err)
	e := ext.(*throttleExtension)
	require.NoError(t, e.Start(context.Background(), host))
	// Shutdown is idempotent: tests that check what it does call it first.
	t.Cleanup(func() { require.NoError(t, e.Shutdown(context.Background())) })
	return e, src, logs
}

// statusPageAddr is where the status page listens, as its log line says;
// "" when it does not.
func statusPageAddr(logs *observer.ObservedLogs) string {
	l := logs.FilterMessage("throttle status page listening").All()
	if len(l) == 0 {
		return ""
	}
	return l[len(l)-1].ContextMap()["endpoint"].(string)
}

// statusDoc is the part of GET /status the tests read.
type statusDoc struct {
	Source string `json:"source"`
	Time   int64  `json:"time"`
	Level  struct {
		Mem        float64 `json:"memory"`
		MemValid   bool    `json:"memory_valid"`
		WorkingSet uint64  `json:"working_set"`
		MemLimit   uint64  `json:"memory_limit"`
	} `json:"level"`
	Thresholds map[string]struct {
		Enabled bool    `json:"enabled"`
		Hard    float64 `json:"hard"`
	} `json:"thresholds"`
	Signals []struct {
		Name            string  `json:"name"`
		Enabled         bool    `json:"enabled"`
		State           string  `json:"state"`
		DropProbability float64 `json:"drop_probability"`
		Allowed         uint64  `json:"allowed"`
		Denied          struct {
			Shed   uint64 `json:"shed"`
			Open   uint64 `json:"open"`
			Budget uint64 `json:"budget"`
		} `json:"denied"`
	} `json:"signals"`
	Budget struct {
		Limit int64 `json:"limit"`
	} `json:"budget"`
	History struct {
		Length int `json:"length"`
	} `json:"history"`
}

func getStatus(t require.TestingT, c *http.Client, base string) statusDoc {
	resp, err := c.Get(base + "/status")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "application/json")
	var doc statusDoc
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	return doc
}

func TestStatusPageServesLiveStatus(t *testing.T) {
	e, src, logs := startStatusExtensionLogged(t, componenttest.NewNopHost(), map[string]any{
		"status": map[string]any{"endpoint": "127.0.0.1:0"},
		"rules":  map[string]any{"logs": map[string]any{"enabled": false}},
	})
	addr := statusPageAddr(logs)
	require.NotEmpty(t, addr, "status server not listening")
	base := "http://" + addr
	tr := &http.Transport{}
	c := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()

	// Decisions counted by every path show up per signal.
	e.runner.Record(admission.ProtocolHTTP, decision.SignalTraces, decision.VerdictAdmit)
	e.runner.Record(admission.ProtocolGRPC, decision.SignalTraces, decision.VerdictAdmit)
	e.RecordProcessorDecision(decision.SignalTraces, decision.VerdictDenyShed)
	e.runner.Record(admission.ProtocolGRPC, decision.SignalMetrics, decision.VerdictDenyBudget)

	doc := getStatus(t, c, base)
	assert.Equal(t, testutil.SourceDescription, doc.Source)
	assert.NotZero(t, doc.Time)
	assert.True(t, doc.Level.MemValid)
	assert.InDelta(t, 0.5, doc.Level.Mem, 1e-9)
	assert.Equal(t, uint64(statusTestCalm), doc.Level.WorkingSet)
	assert.Equal(t, uint64(statusTestLimit), doc.Level.MemLimit)
	assert.False(t, doc.Thresholds["cpu"].Enabled)
	assert.True(t, doc.Thresholds["memory"].Enabled)
	assert.InDelta(t, 0.92, doc.Thresholds["memory"].Hard, 1e-9)
	require.Len(t, doc.Signals, int(decision.NumSignals))
	for i, s := range doc.Signals {
		assert.Equal(t, decision.Signal(i).String(), s.Name)
		assert.Equal(t, "normal", s.State, s.Name)
		assert.Equal(t, decision.Signal(i) != decision.SignalLogs, s.Enabled, s.Name)
	}
	tr0 := doc.Signals[decision.SignalTraces]
	assert.Equal(t, uint64(2), tr0.Allowed)
	assert.Equal(t, uint64(1), tr0.Denied.Shed)
	assert.Equal(t, uint64(1), doc.Signals[decision.SignalMetrics].Denied.Budget)
	assert.Positive(t, doc.Budget.Limit, "auto budget sized from the memory limit")
	assert.Positive(t, doc.History.Length, "the ring holds the samples taken so far")

	// Overload: the page follows the state machines within a few samples.
	src.SetWorkingSet(statusTestOver)
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		d := getStatus(ct, c, base)
		assert.InDelta(ct, 0.95, d.Level.Mem, 1e-9)
		for _, s := range d.Signals {
			assert.Equal(ct, "open", s.State, s.Name)
			// An exempt signal too: memory is over its hard line.
			assert.InDelta(ct, 1, s.DropProbability, 1e-9, s.Name)
		}
	}, 10*time.Second, 10*time.Millisecond)

	// The history shows the Open state and the totals. At a 10ms interval
	// the ring keeps one sample per 125ms (statuspage.NewRingFor), so the
	// Open sample may not be there yet.
	require.EventuallyWithT(t, func(ct *assert.CollectT) {
		resp, err := c.Get(base + "/status/history")
		require.NoError(ct, err)
		defer resp.Body.Close()
		var hist struct {
			Samples []struct {
				States  []uint8 `json:"states"`
				Allowed uint64  `json:"allowed"`
				Denied  uint64  `json:"denied"`
			} `json:"samples"`
		}
		require.NoError(ct, json.NewDecoder(resp.Body).Decode(&hist))
		require.NotEmpty(ct, hist.Samples)
		last := hist.Samples[len(hist.Samples)-1]
		assert.Equal(ct, uint8(decision.StateOpen), last.States[decision.SignalTraces])
		assert.Equal(ct, uint64(2), last.Allowed)
		assert.Equal(ct, uint64(2), last.Denied)
	}, 10*time.Second, 20*time.Millisecond)

	// The page.
	resp, err := c.Get(base + "/")
	require.NoError(t, err)
	page, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, resp.Header.Get("Content-Type"), "text/html")
	assert.Contains(t, strings.ToLower(string(page)), "<html")

	tr.CloseIdleConnections()
	require.NoError(t, e.Shutdown(context.Background()))
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err == nil {
		_ = conn.Close()
	}
	require.Error(t, err, "the status port is still open after Shutdown")
}

func TestStatusPageOffByDefault(t *testing.T) {
	_, _, logs := startStatusExtensionLogged(t, componenttest.NewNopHost(), nil)
	assert.Empty(t, statusPageAddr(logs))
	// No status section, no page (and no ring: the runner's tests check it).
	assert.Nil(t, createDefaultConfig().(*Config).runnerConfig().Status)
}

func TestStatusPageEndpointInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()

	src := newStatusTestSource()
	f := newFactory(factoryOptions{source: src})
	cfg := f.CreateDefaultConfig()
	require.NoError(t, confmap.NewFromStringMap(map[string]any{
		"status": map[string]any{"endpoint": busy.Addr().String()},
	}).Unmarshal(cfg))
	ext, err := f.Create(context.Background(), extensiontest.NewNopSettings(metadata.Type), cfg)
	require.NoError(t, err)
	require.Error(t, ext.Start(context.Background(), componenttest.NewNopHost()))
	// Nothing was left running: Shutdown succeeds and goleak is clean.
	require.NoError(t, ext.Shutdown(context.Background()))
}

func TestReportStatusOpenAndRecovery(t *testing.T) {
	host := testutil.NewStatusHost()
	e, src := startStatusExtension(t, host, map[string]any{
		"report_status": true,
		// An exempt signal rejects nothing in Open, so it is not named.
		"rules": map[string]any{"logs": map[string]any{"enabled": false}},
	})

	src.SetWorkingSet(statusTestOver)
	ev := host.Next(t)
	require.Equal(t, componentstatus.StatusRecoverableError, ev.Status())
	require.EqualError(t, ev.Err(), "throttle: traces, metrics, profiles open (collector overloaded); rejecting requests")
	assert.Equal(t, decision.StateOpen, e.State(decision.SignalTraces))

	src.SetWorkingSet(statusTestCalm)
	ev = host.Next(t)
	require.Equal(t, componentstatus.StatusOK, ev.Status())
	require.NoError(t, ev.Err())
	assert.NotEqual(t, decision.StateOpen, e.State(decision.SignalTraces))

	// Twice more, to see that only transitions are reported.
	src.SetWorkingSet(statusTestOver)
	require.Equal(t, componentstatus.StatusRecoverableError, host.Next(t).Status())
	src.SetWorkingSet(statusTestCalm)
	require.Equal(t, componentstatus.StatusOK, host.Next(t).Status())

	require.NoError(t, e.Shutdown(context.Background()))
	got := host.Recorded()
	statuses := make([]componentstatus.Status, len(got))
	for i, ev := range got {
		statuses[i] = ev.Status()
	}
	assert.Equal(t, []componentstatus.Status{
		componentstatus.StatusRecoverableError, componentstatus.StatusOK,
		componentstatus.StatusRecoverableError, componentstatus.StatusOK,
	}, statuses)
}

// The first sample is taken inside Start: an extension that starts already
// overloaded reports the error too.
func TestReportStatusOpenAtStart(t *testing.T) {
	host := testutil.NewStatusHost()
	src := newStatusTestSource()
	src.SetWorkingSet(statusTestOver)
	f := newFactory(factoryOptions{source: src})
	cfg := f.CreateDefaultConfig()
	require.NoError(t, confmap.NewFromStringMap(map[string]any{
		"report_status": true, "check_interval": "10ms", "stale_after": "0s",
	}).Unmarshal(cfg))
	ext, err := f.Create(context.Background(), extensiontest.NewNopSettings(metadata.Type), cfg)
	require.NoError(t, err)
	require.NoError(t, ext.Start(context.Background(), host))
	defer func() { require.NoError(t, ext.Shutdown(context.Background())) }()
	ev := host.Next(t)
	assert.Equal(t, componentstatus.StatusRecoverableError, ev.Status())
	assert.EqualError(t, ev.Err(), "throttle: traces, metrics, logs, profiles open (collector overloaded); rejecting requests")
}

func TestReportStatusOffByDefault(t *testing.T) {
	host := testutil.NewStatusHost()
	e, src := startStatusExtension(t, host, nil)
	src.SetWorkingSet(statusTestOver)
	require.Eventually(t, func() bool { return e.State(decision.SignalTraces) == decision.StateOpen }, 10*time.Second, 5*time.Millisecond)
	src.SetWorkingSet(statusTestCalm)
	require.Eventually(t, func() bool { return e.State(decision.SignalTraces) != decision.StateOpen }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, e.Shutdown(context.Background()))
	assert.Empty(t, host.Recorded())
}
