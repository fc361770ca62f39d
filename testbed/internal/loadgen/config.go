// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package loadgen

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Signal is an OTLP signal the generator sends.
type Signal int

// The signals, in the order of the OTLP services.
const (
	Traces Signal = iota
	Metrics
	Logs
	numSignals
)

var signalNames = [numSignals]string{"traces", "metrics", "logs"}

func (s Signal) String() string {
	if s >= 0 && s < numSignals {
		return signalNames[s]
	}
	return "signal(" + strconv.Itoa(int(s)) + ")"
}

// httpPath is the otlpreceiver's default path of the signal.
func (s Signal) httpPath() string { return "/v1/" + s.String() }

// grpcMethod is the full method of the signal's OTLP Export RPC.
func (s Signal) grpcMethod() string {
	switch s {
	case Traces:
		return "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
	case Metrics:
		return "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export"
	default:
		return "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
	}
}

// Encoding of OTLP/HTTP bodies.
type Encoding int

// Encodings.
const (
	Proto Encoding = iota
	JSON
)

func (e Encoding) String() string {
	if e == JSON {
		return "json"
	}
	return "proto"
}

// Protocol is the OTLP transport.
type Protocol string

// Protocols.
const (
	HTTP Protocol = "http"
	GRPC Protocol = "grpc"
)

// Phase is one stage of a run. Closed loop (Rate 0): Concurrency workers
// each send their next request as soon as the previous one is answered.
// Open loop (Rate > 0): requests start at Rate per second whatever the
// answers, at most MaxInflight at once; a request due while MaxInflight are
// in flight is not sent and counted as skipped (the generator's cap, not the
// collector's answer).
type Phase struct {
	Name        string
	Duration    time.Duration
	Concurrency int
	Rate        float64
	MaxInflight int
	// Items per request (spans, data points or log records).
	Items int
	// AttrSize is the size in bytes of the big attribute of every item.
	AttrSize int
}

// Weighted is one signal of the mix and its share of the requests.
type Weighted struct {
	Signal Signal
	Weight int
}

// Config of a run.
type Config struct {
	// Target is http://host:port for HTTP, host:port for gRPC.
	Target   string
	Protocol Protocol
	Encoding Encoding
	Gzip     bool
	Signals  []Weighted
	Headers  http.Header
	// Resource are attributes added to the resource of every request's
	// items, as an instrumented service's SDK sets them (a tenant, say),
	// so that a sink can tell the generators' items apart.
	Resource    map[string]string
	Phases      []Phase
	Timeout     time.Duration // per request; also bounds the drain at the end of a phase
	GRPCConns   int           // gRPC client connections (requests are spread over them)
	AllowRemote bool
	// CSVPath is the per-second CSV (empty: none).
	CSVPath string
}

// PhaseNames are the phases of the original design, in order.
var PhaseNames = []string{"warmup", "burst", "bigpayload"}

// headerFlag collects repeated -H "Name: value".
type headerFlag struct{ h http.Header }

func (f *headerFlag) String() string {
	if f == nil || f.h == nil {
		return ""
	}
	var parts []string
	for k, vs := range f.h {
		for _, v := range vs {
			parts = append(parts, k+": "+v)
		}
	}
	return strings.Join(parts, ", ")
}

func (f *headerFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, ":")
	k = strings.TrimSpace(k)
	if !ok || k == "" {
		return fmt.Errorf("header %q: want \"Name: value\"", s)
	}
	f.h.Add(k, strings.TrimSpace(v))
	return nil
}

// ParseFlags parses the command line of cmd/loadgen into a Config.
// Usage and errors go to errOut.
func ParseFlags(args []string, errOut io.Writer) (Config, error) {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	fs.SetOutput(errOut)
	var (
		target      = fs.String("target", "", "OTLP endpoint: http://127.0.0.1:4318 (http) or 127.0.0.1:4317 (grpc); default per -protocol")
		protocol    = fs.String("protocol", "http", "http or grpc")
		encoding    = fs.String("encoding", "proto", "OTLP/HTTP body encoding: proto or json (gRPC is always protobuf)")
		gz          = fs.Bool("gzip", false, "gzip the request bodies (HTTP: compressed once, reused; gRPC: per message)")
		signals     = fs.String("signals", "traces", "signals and their shares: traces,metrics,logs or traces:8,metrics:1,logs:1")
		c           = fs.Int("c", 32, "concurrency of burst and bigpayload (closed loop workers)")
		warmupC     = fs.Int("warmup-c", 2, "concurrency of warmup (always closed loop)")
		d           = fs.Duration("d", 30*time.Second, "duration of each phase")
		warmupD     = fs.Duration("warmup-d", 0, "duration of warmup (0: -d)")
		warmupRate  = fs.Float64("warmup-rate", 0, "open loop requests per second in warmup (0: closed loop with -warmup-c; a closed loop saturates a 1-CPU collector even at c=2)")
		warmupItems = fs.Int("warmup-spans", 50, "items per request in warmup")
		burstItems  = fs.Int("burst-spans", 100, "items per request in burst")
		bigItems    = fs.Int("bigpayload-spans", 500, "items per request in bigpayload")
		attrSize    = fs.Int("attr-size", 256, "bytes of the big attribute of each item")
		bigAttr     = fs.Int("bigpayload-attr-size", 0, "attribute size in bigpayload (0: -attr-size)")
		rate        = fs.Float64("rate", 0, "open loop: requests per second in burst and bigpayload (0: closed loop)")
		maxInflight = fs.Int("max-inflight", 512, "open loop: most requests in flight")
		csvPath     = fs.String("csv", "", "write per-second figures to this CSV file")
		phases      = fs.String("phases", strings.Join(PhaseNames, ","), "phases to run, in this order, from warmup,burst,bigpayload")
		timeout     = fs.Duration("timeout", 15*time.Second, "per-request timeout")
		grpcConns   = fs.Int("grpc-conns", 8, "gRPC connections")
		allowRemote = fs.Bool("allow-remote", false, "allow a target that is not localhost")
	)
	headers := &headerFlag{h: http.Header{}}
	fs.Var(headers, "H", "extra request header \"Name: value\" (repeatable; gRPC: metadata)")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	cfg := Config{
		Target: *target, Protocol: Protocol(*protocol), Gzip: *gz, Headers: headers.h,
		Timeout: *timeout, GRPCConns: *grpcConns, AllowRemote: *allowRemote, CSVPath: *csvPath,
	}
	switch *encoding {
	case "proto", "protobuf":
		cfg.Encoding = Proto
	case "json":
		cfg.Encoding = JSON
	default:
		return Config{}, fmt.Errorf("-encoding %q: want proto or json", *encoding)
	}
	if cfg.Target == "" {
		if cfg.Protocol == GRPC {
			cfg.Target = "127.0.0.1:4317"
		} else {
			cfg.Target = "http://127.0.0.1:4318"
		}
	}
	var err error
	if cfg.Signals, err = ParseSignals(*signals); err != nil {
		return Config{}, err
	}
	wd := *warmupD
	if wd == 0 {
		wd = *d
	}
	ba := *bigAttr
	if ba == 0 {
		ba = *attrSize
	}
	all := map[string]Phase{
		"warmup":     {Name: "warmup", Duration: wd, Concurrency: *warmupC, Rate: *warmupRate, MaxInflight: *maxInflight, Items: *warmupItems, AttrSize: *attrSize},
		"burst":      {Name: "burst", Duration: *d, Concurrency: *c, Rate: *rate, MaxInflight: *maxInflight, Items: *burstItems, AttrSize: *attrSize},
		"bigpayload": {Name: "bigpayload", Duration: *d, Concurrency: *c, Rate: *rate, MaxInflight: *maxInflight, Items: *bigItems, AttrSize: ba},
	}
	for _, name := range strings.Split(*phases, ",") {
		name = strings.TrimSpace(name)
		p, ok := all[name]
		if !ok {
			return Config{}, fmt.Errorf("-phases: unknown phase %q (want warmup, burst, bigpayload)", name)
		}
		cfg.Phases = append(cfg.Phases, p)
	}
	// Validate normalises cfg.Target: call it before cfg is copied out (the
	// order of `return cfg, cfg.Validate()` is unspecified).
	err = cfg.Validate()
	return cfg, err
}

// ParseSignals parses "traces,metrics" (equal shares) or
// "traces:8,metrics:1,logs:1".
func ParseSignals(s string) ([]Weighted, error) {
	var out []Weighted
	seen := map[Signal]bool{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, w, hasW := strings.Cut(part, ":")
		weight := 1
		if hasW {
			n, err := strconv.Atoi(w)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("-signals %q: weight %q must be an integer >= 0", s, w)
			}
			weight = n
		}
		sig := Signal(-1)
		for i, n := range signalNames {
			if n == name {
				sig = Signal(i)
			}
		}
		if sig < 0 {
			return nil, fmt.Errorf("-signals %q: unknown signal %q (want traces, metrics, logs)", s, name)
		}
		if seen[sig] {
			return nil, fmt.Errorf("-signals %q: %s twice", s, name)
		}
		seen[sig] = true
		if weight > 0 {
			out = append(out, Weighted{Signal: sig, Weight: weight})
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-signals %q: no signal with a share > 0", s)
	}
	return out, nil
}

// Validate checks the config, including that the target is on this machine
// unless AllowRemote: a load generator pointed at the wrong host is an attack.
func (c *Config) Validate() error {
	var errs []error
	host, err := c.targetHost()
	if err != nil {
		errs = append(errs, err)
	} else if !c.AllowRemote && !IsLocalHost(host) {
		errs = append(errs, fmt.Errorf("target host %q is not localhost; pass -allow-remote to load another machine", host))
	}
	if c.Protocol != HTTP && c.Protocol != GRPC {
		errs = append(errs, fmt.Errorf("protocol %q: want http or grpc", c.Protocol))
	}
	if len(c.Signals) == 0 {
		errs = append(errs, errors.New("no signals"))
	}
	if len(c.Phases) == 0 {
		errs = append(errs, errors.New("no phases"))
	}
	if c.Timeout <= 0 {
		errs = append(errs, errors.New("timeout must be > 0"))
	}
	if c.Protocol == GRPC && c.GRPCConns < 1 {
		errs = append(errs, errors.New("grpc-conns must be >= 1"))
	}
	for _, p := range c.Phases {
		switch {
		case p.Duration <= 0:
			errs = append(errs, fmt.Errorf("phase %s: duration must be > 0", p.Name))
		case p.Rate < 0:
			errs = append(errs, fmt.Errorf("phase %s: rate must be >= 0", p.Name))
		case p.Rate == 0 && p.Concurrency < 1:
			errs = append(errs, fmt.Errorf("phase %s: concurrency must be >= 1", p.Name))
		case p.Rate > 0 && p.MaxInflight < 1:
			errs = append(errs, fmt.Errorf("phase %s: max-inflight must be >= 1 in open loop", p.Name))
		case p.Items < 1:
			errs = append(errs, fmt.Errorf("phase %s: items per request must be >= 1", p.Name))
		case p.AttrSize < 0:
			errs = append(errs, fmt.Errorf("phase %s: attribute size must be >= 0", p.Name))
		}
	}
	return errors.Join(errs...)
}

// targetHost returns the host of the target, and normalises an HTTP target
// to scheme://host:port without a trailing slash.
func (c *Config) targetHost() (string, error) {
	t := c.Target
	if c.Protocol == GRPC {
		t = strings.TrimPrefix(strings.TrimPrefix(t, "http://"), "grpc://")
		host, _, err := net.SplitHostPort(t)
		if err != nil {
			return "", fmt.Errorf("gRPC target %q: want host:port: %w", c.Target, err)
		}
		c.Target = t
		return host, nil
	}
	u, err := url.Parse(t)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("HTTP target %q: want http://host:port", c.Target)
	}
	c.Target = strings.TrimSuffix(u.Scheme+"://"+u.Host+u.Path, "/")
	return u.Hostname(), nil
}

// IsLocalHost reports whether host is localhost or a loopback address.
func IsLocalHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
