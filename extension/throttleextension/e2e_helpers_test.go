// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension

// Helpers of the end-to-end tests (e2e_test.go) and benchmarks
// (bench_e2e_test.go): the real otlpreceiver with the throttle as its HTTP
// and gRPC middleware, a started throttle extension whose water level the
// test drives through a fake resource source, and raw net/http and grpc-go
// clients. The tests with real OTLP exporters as clients are in the testbed
// module (testbed/test/exporters), which keeps the exporters out of this
// module's go.mod. Every identifier starts with e2e so that it cannot clash
// with the other test files of the package.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/confmap"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/consumer/consumertest"
	"go.opentelemetry.io/collector/consumer/xconsumer"
	"go.opentelemetry.io/collector/pdata/plog/plogotlp"
	"go.opentelemetry.io/collector/pdata/pmetric/pmetricotlp"
	"go.opentelemetry.io/collector/pdata/pprofile/pprofileotlp"
	"go.opentelemetry.io/collector/pdata/ptrace/ptraceotlp"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.opentelemetry.io/collector/receiver/receivertest"
	"go.opentelemetry.io/collector/receiver/xreceiver"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/otelthrottle/throttle/extension/throttleextension/internal/metadatatest"
	"github.com/otelthrottle/throttle/internal/cgroup"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/e2edata"
	"github.com/otelthrottle/throttle/internal/testutil"
	"github.com/otelthrottle/throttle/internal/throttleapi"
)

// e2eMemLimit is the memory limit the fake source reports. 1 GiB keeps the
// "auto" admission budget (limit/12 = 85 MiB) out of the way of the tests,
// which are about the state machines, and of the 512 KiB benchmark bodies.
const e2eMemLimit = 1 << 30

// Memory levels, as a share of e2eMemLimit, against the test thresholds
// (mem enter 0.5, exit 0.4, hard 0.9).
const (
	e2eCalm     = 0.1  // under every line: Normal
	e2eShedding = 0.7  // half way from enter to hard: Shedding, p_drop = 0.5
	e2eOpen     = 0.95 // over hard: Open
)

// e2eRetryLow and e2eRetryHigh are the retry_after min and max of the tests: at
// least one second so that Retry-After (whole seconds) is not 0 and the
// exporters really wait, short so that the retry tests stay quick.
const (
	e2eRetryLow  = time.Second
	e2eRetryHigh = 2 * time.Second
)

// e2eWait bounds every wait of the tests.
const e2eWait = 30 * time.Second

// e2eHost is the host the receiver starts with: it holds the throttle
// extension, which is all confighttp and configgrpc need to resolve the
// middlewares.
type e2eHost struct {
	exts map[component.ID]component.Component
}

func (h e2eHost) GetExtensions() map[component.ID]component.Component { return h.exts }

// e2eEnv is a started throttle extension and a started otlpreceiver (gRPC
// and HTTP, both with middlewares: [{id: throttle}]) feeding sinks.
type e2eEnv struct {
	src *testutil.Source
	ext component.Component
	th  throttleapi.Throttle
	tel *componenttest.Telemetry

	httpAddr, grpcAddr string
	// receivers are the started otlpreceivers (one shared server): a test
	// may shut them down itself, as the service does; later Shutdowns do
	// nothing.
	receivers []component.Component

	traces   *consumertest.TracesSink
	metrics  *consumertest.MetricsSink
	logs     *consumertest.LogsSink
	profiles *consumertest.ProfilesSink
}

// e2eOptions customise startE2E.
type e2eOptions struct {
	// conf holds throttle configuration keys; top-level keys replace the
	// test defaults.
	conf map[string]any
	// nopConsumers sends everything to consumertest.NewNop instead of the
	// sinks (benchmarks: the sinks would keep every batch).
	nopConsumers bool
	// nopTelemetry gives the extension no-op telemetry instead of an SDK
	// meter provider.
	nopTelemetry bool
	// traces, when set, receives the traces instead of env.traces.
	traces consumer.Traces
}

// e2eFreeAddr returns a loopback address nobody listens on right now.
func e2eFreeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(tb, err)
	addr := l.Addr().String()
	require.NoError(tb, l.Close())
	return addr
}

// e2eThrottleConfig is the throttle configuration of the tests: a 10ms
// check interval, no CPU slot (the fake source uses none), a memory slot
// that reacts to one check, no recovery ramp so that leaving Open is
// immediate, no stale fallback (a sampler starved under -race must not turn
// Open into Normal), a short retry_after range and no tarpit (the tests of
// the tarpit turn it on).
func e2eThrottleConfig(tb testing.TB, extra map[string]any) *Config {
	tb.Helper()
	conf := map[string]any{
		"check_interval": "10ms",
		"recovery_ramp":  "0s",
		"stale_after":    "0s",
		"retry_after":    map[string]any{"min": e2eRetryLow.String(), "max": e2eRetryHigh.String()},
		"tarpit":         map[string]any{"delay": "0s"},
		// Refusals are answered at once unless a test turns holding on.
		"hold":   map[string]any{"max_wait": "0s"},
		"cpu":    map[string]any{"enabled": false},
		"memory": map[string]any{"enabled": true, "enter": 0.5, "exit": 0.4, "hard": 0.9, "breach_duration": "0s"},
	}
	maps.Copy(conf, extra)
	cfg := createDefaultConfig().(*Config)
	require.NoError(tb, confmap.NewFromStringMap(conf).Unmarshal(cfg))
	require.NoError(tb, confmap.Validate(cfg))
	return cfg
}

// startE2EThrottle starts the throttle extension alone (no receiver): the
// admit-path benchmark wraps a handler of its own with it.
func startE2EThrottle(tb testing.TB, opts e2eOptions) *e2eEnv {
	tb.Helper()
	ctx := context.Background()
	env := &e2eEnv{
		src:      testutil.NewSource(cgroup.Limits{MemLimit: e2eMemLimit}),
		tel:      componenttest.NewTelemetry(),
		traces:   new(consumertest.TracesSink),
		metrics:  new(consumertest.MetricsSink),
		logs:     new(consumertest.LogsSink),
		profiles: new(consumertest.ProfilesSink),
	}
	env.src.SetMemoryShare(e2eCalm)
	tb.Cleanup(func() { require.NoError(tb, env.tel.Shutdown(ctx)) })

	// The extension, created by the public factory with the test seam.
	f := newFactory(factoryOptions{source: env.src})
	set := metadatatest.NewSettings(env.tel)
	if opts.nopTelemetry {
		set.TelemetrySettings = componenttest.NewNopTelemetrySettings()
	}
	ext, err := f.Create(ctx, set, e2eThrottleConfig(tb, opts.conf))
	require.NoError(tb, err)
	th, ok := ext.(throttleapi.Throttle)
	require.Truef(tb, ok, "the extension (%T) does not implement throttleapi.Throttle", ext)
	env.ext, env.th = ext, th
	require.NoError(tb, ext.Start(ctx, componenttest.NewNopHost()))
	tb.Cleanup(func() { require.NoError(tb, ext.Shutdown(ctx)) })
	return env
}

// startE2E starts the throttle extension and the otlpreceiver that uses it
// as the middleware of both its servers.
func startE2E(tb testing.TB, opts e2eOptions) *e2eEnv {
	tb.Helper()
	env := startE2EThrottle(tb, opts)
	// A free port can be taken by another test between e2eFreeAddr and the
	// receiver's listen: start again on new ones.
	var err error
	for range 5 {
		if err = env.startReceiver(tb, opts); !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	require.NoError(tb, err)
	return env
}

// startReceiver starts the otlpreceiver with the throttle as the middleware
// of both its servers, on two new free addresses.
func (env *e2eEnv) startReceiver(tb testing.TB, opts e2eOptions) error {
	tb.Helper()
	ctx := context.Background()
	// The receiver, configured as a user would in YAML.
	env.httpAddr, env.grpcAddr = e2eFreeAddr(tb), e2eFreeAddr(tb)
	middlewares := []any{map[string]any{"id": "throttle"}}
	rf := otlpreceiver.NewFactory()
	rcfg := rf.CreateDefaultConfig()
	require.NoError(tb, confmap.NewFromStringMap(map[string]any{
		"protocols": map[string]any{
			"grpc": map[string]any{"endpoint": env.grpcAddr, "middlewares": middlewares},
			"http": map[string]any{"endpoint": env.httpAddr, "middlewares": middlewares},
		},
	}).Unmarshal(rcfg))
	require.NoError(tb, confmap.Validate(rcfg))

	var (
		tc consumer.Traces    = env.traces
		mc consumer.Metrics   = env.metrics
		lc consumer.Logs      = env.logs
		pc xconsumer.Profiles = env.profiles
	)
	if opts.nopConsumers {
		nop := consumertest.NewNop()
		tc, mc, lc, pc = nop, nop, nop, nop
	}
	if opts.traces != nil {
		tc = opts.traces
	}
	rset := receivertest.NewNopSettings(rf.Type())
	// otlpreceiver shares one server between the receivers of one config:
	// creating all four registers every signal, starting one starts it.
	var rcvs []component.Component
	tr, err := rf.CreateTraces(ctx, rset, rcfg, tc)
	require.NoError(tb, err)
	mr, err := rf.CreateMetrics(ctx, rset, rcfg, mc)
	require.NoError(tb, err)
	lr, err := rf.CreateLogs(ctx, rset, rcfg, lc)
	require.NoError(tb, err)
	pr, err := rf.(xreceiver.Factory).CreateProfiles(ctx, rset, rcfg, pc)
	require.NoError(tb, err)
	rcvs = append(rcvs, tr, mr, lr, pr)
	host := e2eHost{exts: map[component.ID]component.Component{component.MustNewID("throttle"): env.ext}}
	var started []component.Component
	tb.Cleanup(func() {
		for _, r := range started {
			require.NoError(tb, r.Shutdown(ctx))
		}
	})
	for _, r := range rcvs {
		if err := r.Start(ctx, host); err != nil {
			return errors.Join(err, r.Shutdown(ctx))
		}
		started = append(started, r)
	}
	env.receivers = started
	return nil
}

// setLevel sets the memory level and waits until the state machines (every
// signal shares them) are in want.
func (env *e2eEnv) setLevel(tb testing.TB, level float64, want decision.State) {
	tb.Helper()
	env.src.SetMemoryShare(level)
	require.Eventuallyf(tb, func() bool {
		for s := range decision.SignalProfiles + 1 {
			if env.th.State(s) != want {
				return false
			}
		}
		return true
	}, e2eWait, time.Millisecond, "state never became %v at level %v", want, level)
}

// requests is the throttle_requests counter for one protocol, signal and
// decision (see e2edata.Requests).
func (env *e2eEnv) requests(tb testing.TB, protocol string, s decision.Signal, decisionName, reason string) int64 {
	tb.Helper()
	return e2edata.Requests(tb, env.tel, protocol, s.String(), decisionName, reason)
}

// e2eSignal is one signal as the tests send it: its throttle signal, its
// OTLP/HTTP path, and payload builders of n items.
type e2eSignal struct {
	sig  decision.Signal
	path string
	// proto and json encode an export request of n items.
	proto, json func(n int) ([]byte, error)
	// grpcExport sends n items with a raw grpc-go client.
	grpcExport func(ctx context.Context, cc *grpc.ClientConn, n int) error
	// received counts the items at env's sink.
	received func(env *e2eEnv) int
}

var e2eSignals = []e2eSignal{
	{
		sig:  decision.SignalTraces,
		path: "/v1/traces",
		proto: func(n int) ([]byte, error) {
			return ptraceotlp.NewExportRequestFromTraces(e2edata.Traces(n)).MarshalProto()
		},
		json: func(n int) ([]byte, error) {
			return ptraceotlp.NewExportRequestFromTraces(e2edata.Traces(n)).MarshalJSON()
		},
		grpcExport: func(ctx context.Context, cc *grpc.ClientConn, n int) error {
			_, err := ptraceotlp.NewGRPCClient(cc).Export(ctx, ptraceotlp.NewExportRequestFromTraces(e2edata.Traces(n)))
			return err
		},
		received: func(env *e2eEnv) int { return env.traces.SpanCount() },
	},
	{
		sig:  decision.SignalMetrics,
		path: "/v1/metrics",
		proto: func(n int) ([]byte, error) {
			return pmetricotlp.NewExportRequestFromMetrics(e2edata.Metrics(n)).MarshalProto()
		},
		json: func(n int) ([]byte, error) {
			return pmetricotlp.NewExportRequestFromMetrics(e2edata.Metrics(n)).MarshalJSON()
		},
		grpcExport: func(ctx context.Context, cc *grpc.ClientConn, n int) error {
			_, err := pmetricotlp.NewGRPCClient(cc).Export(ctx, pmetricotlp.NewExportRequestFromMetrics(e2edata.Metrics(n)))
			return err
		},
		received: func(env *e2eEnv) int { return env.metrics.DataPointCount() },
	},
	{
		sig:  decision.SignalLogs,
		path: "/v1/logs",
		proto: func(n int) ([]byte, error) {
			return plogotlp.NewExportRequestFromLogs(e2edata.Logs(n)).MarshalProto()
		},
		json: func(n int) ([]byte, error) {
			return plogotlp.NewExportRequestFromLogs(e2edata.Logs(n)).MarshalJSON()
		},
		grpcExport: func(ctx context.Context, cc *grpc.ClientConn, n int) error {
			_, err := plogotlp.NewGRPCClient(cc).Export(ctx, plogotlp.NewExportRequestFromLogs(e2edata.Logs(n)))
			return err
		},
		received: func(env *e2eEnv) int { return env.logs.LogRecordCount() },
	},
	{
		sig:  decision.SignalProfiles,
		path: "/v1development/profiles",
		proto: func(n int) ([]byte, error) {
			return pprofileotlp.NewExportRequestFromProfiles(e2edata.Profiles(n)).MarshalProto()
		},
		json: func(n int) ([]byte, error) {
			return pprofileotlp.NewExportRequestFromProfiles(e2edata.Profiles(n)).MarshalJSON()
		},
		grpcExport: func(ctx context.Context, cc *grpc.ClientConn, n int) error {
			_, err := pprofileotlp.NewGRPCClient(cc).Export(ctx, pprofileotlp.NewExportRequestFromProfiles(e2edata.Profiles(n)))
			return err
		},
		received: func(env *e2eEnv) int { return env.profiles.SampleCount() },
	},
}

// e2eHTTPClient returns a client of its own whose idle connections are
// closed when the test ends (goleak).
func e2eHTTPClient(tb testing.TB) *http.Client {
	tr := &http.Transport{MaxIdleConnsPerHost: 64, ExpectContinueTimeout: time.Minute}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: e2eWait}
}

// e2eResponse is a response with its body read.
type e2eResponse struct {
	*http.Response
	body []byte
}

// post sends body to env's HTTP server at path.
func (env *e2eEnv) post(tb testing.TB, c *http.Client, path, contentType string, body []byte) e2eResponse {
	tb.Helper()
	resp, err := env.tryPost(c, path, contentType, body)
	require.NoError(tb, err)
	return resp
}

// tryPost is post returning its error instead of failing the test, for
// goroutines other than the test's.
func (env *e2eEnv) tryPost(c *http.Client, path, contentType string, body []byte) (e2eResponse, error) {
	req, err := http.NewRequest(http.MethodPost, "http://"+env.httpAddr+path, bytes.NewReader(body))
	if err != nil {
		return e2eResponse{}, err
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := c.Do(req)
	if err != nil {
		return e2eResponse{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return e2eResponse{}, err
	}
	return e2eResponse{Response: resp, body: b}, nil
}

// grpcConn returns a raw grpc-go client connection to env's gRPC server,
// closed when the test ends.
func (env *e2eEnv) grpcConn(tb testing.TB) *grpc.ClientConn {
	tb.Helper()
	cc, err := grpc.NewClient(env.grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, cc.Close()) })
	return cc
}
