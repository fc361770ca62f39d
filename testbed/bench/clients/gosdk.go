// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/go-logr/logr"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/instrumentation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	_ "google.golang.org/grpc/encoding/gzip" // registers the gzip compressor -compression gzip names
)

// goSDKClient is a client process of the OpenTelemetry Go SDK's OTLP trace
// exporter (otlptracehttp or otlptracegrpc, the release of the testbed's
// go.mod), default settings but the endpoint and the flags below, which
// only the matrix's variants set.
type goSDKClient struct {
	app
	protocol, endpoint, bind, compression string
	// timeout: the exporter's WithTimeout (0: its default, 10s);
	// retryMaxElapsed: WithRetry's MaxElapsedTime (0: the default retry
	// policy, 1 min); exportTimeout: the deadline of each ExportSpans, as
	// the BatchSpanProcessor sets it (its default, 30s).
	timeout, retryMaxElapsed, exportTimeout time.Duration
}

func runGoSDKClient(args []string) error {
	c := &goSDKClient{}
	fs := flag.NewFlagSet("gosdk", flag.ContinueOnError)
	c.register(fs)
	fs.StringVar(&c.protocol, "protocol", "http", "http (otlptracehttp) or grpc (otlptracegrpc)")
	fs.StringVar(&c.endpoint, "endpoint", "", "the gateway's OTLP endpoint, host:port")
	fs.StringVar(&c.bind, "bind", "", "local address the exporter's connections come from (127.0.0.x)")
	fs.StringVar(&c.compression, "compression", "", "gzip: WithCompression / WithCompressor gzip (default: none, the exporters' default)")
	fs.DurationVar(&c.timeout, "timeout", 0, "WithTimeout (0: the default, 10s)")
	fs.DurationVar(&c.retryMaxElapsed, "retry-max-elapsed", 0, "WithRetry with this MaxElapsedTime and the default intervals (0: the default policy)")
	fs.DurationVar(&c.exportTimeout, "export-timeout", sdktrace.DefaultExportTimeout*time.Millisecond, "deadline of each export, as the BatchSpanProcessor's WithExportTimeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := c.validate(); err != nil {
		return err
	}
	logs := &tally{}
	// What the SDK logs and reports to its error handler goes to the result.
	otel.SetLogger(logr.New(&tallySink{t: logs}))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { logs.add(err.Error()) }))

	exp, settings, err := c.exporter()
	if err != nil {
		return err
	}
	res := resource.NewSchemaless(attribute.String("service.name", c.name))
	scope := instrumentation.Scope{Name: "throttle/testbed/bench/clients"}
	hand := func(seq, n uint64) (bool, error) {
		spans := make([]sdktrace.ReadOnlySpan, n)
		now := time.Now()
		for i := range n {
			tid, sid := encodeIDs(c.id, seq+i)
			spans[i] = tracetest.SpanStub{
				Name: "matrix-span",
				SpanContext: trace.NewSpanContext(trace.SpanContextConfig{
					TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled,
				}),
				SpanKind:  trace.SpanKindServer,
				StartTime: now.Add(-time.Millisecond), EndTime: now,
				Attributes: []attribute.KeyValue{
					attribute.String("matrix.client", c.name),
					attribute.String("matrix.seq", strconv.FormatUint(seq+i, 10)),
					attribute.String("matrix.payload", payload(c.attrSize, seq+i)),
				},
				Resource: res, InstrumentationScope: scope,
			}.Snapshot()
		}
		ctx, cancel := context.WithTimeout(context.Background(), c.exportTimeout)
		defer cancel()
		return true, exp.ExportSpans(ctx, spans)
	}
	r := c.run(hand)
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := exp.Shutdown(sctx); err != nil {
		logs.add("shutdown: " + err.Error())
	}
	r.Logs = logs.snapshot()
	r.Settings = settings
	return r.write(c.out)
}

// exporter builds the exporter and describes its settings.
func (c *goSDKClient) exporter() (*otlptrace.Exporter, map[string]string, error) {
	if c.endpoint == "" {
		return nil, nil, errors.New("-endpoint: the gateway's host:port is needed")
	}
	settings := map[string]string{
		"export deadline (BatchSpanProcessor)": c.exportTimeout.String(),
		"timeout":                              "default (10s)",
		"retry":                                "default (5s initial, 30s max interval, 1m max elapsed)",
		"compression":                          "default (none)",
	}
	if c.timeout > 0 {
		settings["timeout"] = c.timeout.String()
	}
	if c.retryMaxElapsed > 0 {
		settings["retry"] = "WithRetry(MaxElapsedTime: " + c.retryMaxElapsed.String() + ", default intervals)"
	}
	if c.compression != "" {
		settings["compression"] = c.compression
	}
	// The default retry policy's intervals (internal/retry.DefaultConfig)
	// with a longer MaxElapsedTime.
	const initialInterval, maxInterval = 5 * time.Second, 30 * time.Second
	var local net.Addr
	if c.bind != "" {
		ip := net.ParseIP(c.bind)
		if ip == nil {
			return nil, nil, fmt.Errorf("-bind %q: not an IP address", c.bind)
		}
		local = &net.TCPAddr{IP: ip}
		settings["source address"] = c.bind
	}
	dialer := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second, LocalAddr: local}
	ctx := context.Background()
	switch c.protocol {
	case "http":
		opts := []otlptracehttp.Option{otlptracehttp.WithEndpoint(c.endpoint), otlptracehttp.WithInsecure()}
		if local != nil {
			// The exporter's own client (client.go: a copy of
			// http.DefaultTransport, Timeout = the export timeout) with
			// the dialer bound to the source address.
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.DialContext = dialer.DialContext
			timeout := otlptracehttpDefaultTimeout
			if c.timeout > 0 {
				timeout = c.timeout
			}
			opts = append(opts, otlptracehttp.WithHTTPClient(&http.Client{Transport: tr, Timeout: timeout}))
		}
		if c.timeout > 0 {
			opts = append(opts, otlptracehttp.WithTimeout(c.timeout))
		}
		if c.retryMaxElapsed > 0 {
			opts = append(opts, otlptracehttp.WithRetry(otlptracehttp.RetryConfig{
				Enabled: true, InitialInterval: initialInterval, MaxInterval: maxInterval, MaxElapsedTime: c.retryMaxElapsed,
			}))
		}
		if c.compression == "gzip" {
			opts = append(opts, otlptracehttp.WithCompression(otlptracehttp.GzipCompression))
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		settings["exporter"] = "otlptracehttp " + otelVersion()
		return exp, settings, err
	case "grpc":
		opts := []otlptracegrpc.Option{otlptracegrpc.WithEndpoint(c.endpoint), otlptracegrpc.WithInsecure()}
		if local != nil {
			opts = append(opts, otlptracegrpc.WithDialOption(grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
				return dialer.DialContext(ctx, "tcp", addr)
			})))
		}
		if c.timeout > 0 {
			opts = append(opts, otlptracegrpc.WithTimeout(c.timeout))
		}
		if c.retryMaxElapsed > 0 {
			opts = append(opts, otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{
				Enabled: true, InitialInterval: initialInterval, MaxInterval: maxInterval, MaxElapsedTime: c.retryMaxElapsed,
			}))
		}
		if c.compression == "gzip" {
			opts = append(opts, otlptracegrpc.WithCompressor("gzip"))
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		settings["exporter"] = "otlptracegrpc " + otelVersion()
		return exp, settings, err
	}
	return nil, nil, fmt.Errorf("-protocol %q: want http or grpc", c.protocol)
}

// otlptracehttpDefaultTimeout is otlptracehttp's default export timeout
// (internal/otlpconfig.DefaultTimeout), which its own HTTP client uses as
// its Timeout.
const otlptracehttpDefaultTimeout = 10 * time.Second

func otelVersion() string { return "v" + otel.Version() }

// tallySink is a logr sink that counts the SDK's log messages.
type tallySink struct{ t *tally }

func (*tallySink) Init(logr.RuntimeInfo)  {}
func (*tallySink) Enabled(level int) bool { return level <= 4 }
func (s *tallySink) Info(level int, msg string, kv ...any) {
	s.t.add("info(" + strconv.Itoa(level) + "): " + msg + kvText(kv))
}

func (s *tallySink) Error(err error, msg string, kv ...any) {
	s.t.add("error: " + msg + ": " + errText(err) + kvText(kv))
}
func (s *tallySink) WithValues(...any) logr.LogSink { return s }
func (s *tallySink) WithName(string) logr.LogSink   { return s }

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

func kvText(kv []any) string {
	if len(kv) == 0 {
		return ""
	}
	return " " + fmt.Sprint(kv...)
}

// childMain runs the process role named by the environment (see roleEnv)
// and reports whether it did.
func childMain() bool {
	role := os.Getenv(roleEnv)
	if role == "" {
		return false
	}
	var err error
	switch role {
	case roleGoSDK:
		err = runGoSDKClient(os.Args[1:])
	case roleFeeder:
		err = runFeeder(os.Args[1:])
	case roleMemPulse:
		err = runMemPulse(os.Args[1:])
	case roleCPUBurn:
		err = runCPUBurn(os.Args[1:])
	default:
		err = fmt.Errorf("%s=%q: unknown role", roleEnv, role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
		os.Exit(1)
	}
	return true
}

// The driver starts its helper processes as itself (or the test binary)
// with roleEnv naming the role.
const (
	roleEnv      = "THROTTLE_CLIENTS_ROLE"
	roleGoSDK    = "gosdk"
	roleFeeder   = "feeder"
	roleMemPulse = "mempulse"
	roleCPUBurn  = "cpuburn"
)
