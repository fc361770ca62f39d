// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Client kinds: which exporter, over which protocol.
const (
	goHTTP  = "go-http"  // the Go SDK's otlptracehttp
	goGRPC  = "go-grpc"  // the Go SDK's otlptracegrpc
	jsHTTP  = "js-http"  // @opentelemetry/exporter-trace-otlp-proto
	jsGRPC  = "js-grpc"  // @opentelemetry/exporter-trace-otlp-grpc
	colHTTP = "col-http" // a stock collector agent's otlp_http exporter
	colGRPC = "col-grpc" // a stock collector agent's otlp_grpc exporter
)

// allKinds is every client kind, in the report's order.
var allKinds = []string{goHTTP, goGRPC, jsHTTP, jsGRPC, colHTTP, colGRPC}

// Variants: a client kind with settings other than its defaults.
const (
	// variantLossless: the client settings that make it lose nothing
	// through a long Open (docs/clients.md), for clients whose whole retry
	// budget is shorter than scenario b's Open.
	variantLossless = "lossless"
	// variantGzipLarge: large batches, gzip'd (scenario d).
	variantGzipLarge = "gzip-large"
)

// losslessBudget is the export budget of the lossless variants: scenario
// b's Open (60 s) and the longest retry hint the shipped defaults give (30
// s), with room to spare.
const losslessBudget = 2 * time.Minute

// clientSpec is one client of a scenario.
type clientSpec struct {
	kind, variant string
	// rate in spans/s (0: as fast as the gateway answers), workers, spans
	// per batch and payload bytes per span.
	rate              float64
	workers           int
	batch             uint64
	attrSize          int
	exportBudget      time.Duration // how long its last export may take after the load (for the drain)
	id                uint32        // 1-based, set by the scenario
	addr              string        // source address, 127.0.0.(10+id)
	sdkArgs, nodeArgs []string      // the variant's settings
}

// setID makes c client number n (1-based) of its scenario, sending from
// 127.0.0.(10+n).
func (c *clientSpec) setID(n int) {
	c.id = uint32(min(max(n, 1), 200))
	c.addr = fmt.Sprintf("127.0.0.%d", 10+c.id)
}

func (c clientSpec) name() string {
	if c.variant == "" {
		return c.kind
	}
	return c.kind + "+" + c.variant
}

func (c clientSpec) isAgent() bool { return c.kind == colHTTP || c.kind == colGRPC }
func (c clientSpec) isGo() bool    { return c.kind == goHTTP || c.kind == goGRPC }
func (c clientSpec) isJS() bool    { return c.kind == jsHTTP || c.kind == jsGRPC }

// newClient is kind with its defaults: the exporter's default settings
// and the application's load.
func newClient(kind string, rate float64, workers int) clientSpec {
	c := clientSpec{kind: kind, rate: rate, workers: workers, batch: 512, attrSize: 64}
	switch {
	case c.isGo():
		// The BatchSpanProcessor's export deadline (30 s) bounds the
		// exporter's own (gRPC: 10 s; HTTP: 1 min of retries).
		c.exportBudget = 30 * time.Second
	case c.isJS():
		c.exportBudget = 30 * time.Second
	}
	return c
}

// lossless is c with the settings that let it wait out a long Open.
func (c clientSpec) lossless() clientSpec {
	c.variant = variantLossless
	c.exportBudget = losslessBudget
	b := losslessBudget.String()
	ms := strconv.FormatInt(losslessBudget.Milliseconds(), 10)
	switch {
	case c.kind == goHTTP:
		// The per-attempt timeout stays 10 s: each attempt is answered.
		c.sdkArgs = []string{"-retry-max-elapsed", b, "-export-timeout", b}
	case c.kind == goGRPC:
		c.sdkArgs = []string{"-timeout", b, "-retry-max-elapsed", b, "-export-timeout", b}
	case c.isJS():
		c.nodeArgs = []string{"--timeout-millis", ms, "--export-timeout-millis", ms}
	}
	return c
}

// gzipLarge is c with large gzip'd batches of spans with 400 payload
// bytes: over HTTP 8192 spans, about 4 MiB of protobuf, most of the
// gateway's admission budget (5 MiB); over gRPC 4096, about 2 MiB, as the
// otlp receiver takes no gRPC message over 4 MiB by default.
func (c clientSpec) gzipLarge(rate float64) clientSpec {
	c.variant = variantGzipLarge
	c.rate, c.workers, c.batch, c.attrSize = rate, 4, 8192, 400
	if c.kind == goGRPC || c.kind == jsGRPC {
		c.batch = 4096
	}
	switch {
	case c.isGo():
		c.sdkArgs = []string{"-compression", "gzip"}
	case c.isJS():
		c.nodeArgs = []string{"--compression", "gzip"}
	}
	return c
}

// scenario is one scenario of the matrix (see Scenarios in main.go).
type scenario struct {
	name, title string
	// throttle returns the extension's settings ("" = shipped defaults),
	// under the new configuration names or the old (cpuLines.yaml).
	throttle func(renamed bool) string
	clients  []clientSpec
	load     time.Duration
	// What makes the gateway open: a CPU load over CPU lines under the
	// quota or a memory pulse (stressCPU, stressMemory), at each spell
	// (start from the load's start, length); none in c and d.
	stress string
	spells []spell
	// needsCapacity: the clients' rates are shares of the gateway's
	// capacity (c).
	needsCapacity bool
	factor        float64
	// cpus is the gateway's CPU quota unless -cpus gives one.
	cpus float64
	// stock runs the stock collector as the gateway, without the throttle
	// (stressBackend's scenarios, side by side).
	stock bool
	// sinkRate is what the slow sink takes, spans/s (stressSlow).
	sinkRate float64
	// downstream turns the throttle's downstream level on; queueSize sets
	// the gateway exporter's queue_size (0: its default, 1000 batches).
	downstream bool
	queueSize  int
	// blockOnOverflow: a full queue waits (the capacity step).
	blockOnOverflow bool
}

// defaultCPUs is the gateway's CPU quota in the scenarios: on this 2-core
// machine the other cores run the clients, the agents and the sink and can
// offer it twice its capacity.
const defaultCPUs = 0.5

// contendedCPUs is the gateway's CPU quota in d: with its 3 MiB budget
// (the per-core bound) the large bodies, about 4 MB decoded each, contend
// for it and are larger than it; at 0.5 CPU on a quiet machine they were
// not refused at all.
const contendedCPUs = 0.3

// Stress kinds.
const (
	// stressCPU: a helper in the gateway's CPU cgroup keeps -burn of its
	// quota busy, over CPU lines set under the quota (underQuota).
	stressCPU = "cpu"
	// stressMemory: a helper in the gateway's memory cgroup holds
	// -pulse-target of its limit, against the shipped memory lines.
	stressMemory = "memory"
	// stressBackend: the sink stops answering: a hung backend.
	stressBackend = "backend"
	// stressSlow: the sink takes a share of what the clients offer: a
	// slow backend.
	stressSlow = "slow"
)

// hungQueueSize is the gateway exporter's queue in the hung-backend
// scenarios, in batches: full within the hang at the clients' load (about
// five batches a second, ten more held by the exporter's consumers), so
// that what the gateway does with a full queue shows; the default (1000)
// takes a hang of minutes at this load.
const hungQueueSize = 10

// spell is one run of the stress: from start (since the load's start) for
// length.
type spell struct{ start, length time.Duration }

// underQuota are the CPU lines of the CPU stress: the gateway's own load in
// the scenarios stays below exit, and with the helper's load it is above
// hard.
var underQuota = cpuLines{enter: 0.45, exit: 0.35, hard: 0.6}

// scenarioNames are the scenarios -scenario accepts.
var scenarioNames = []string{"a", "b", "c", "d", "e", "e-throttle", "e-stock", "f", "f-throttle", "f-stock"}

// backendGateways name the gateway of the backend scenarios' variants:
// none, -throttle and -stock.
var backendGateways = map[string]string{"": "throttle with the downstream level", "-throttle": "throttle without the downstream level", "-stock": "the stock collector"}

// buildScenario returns scenario name for the options; capacity is the
// gateway's (spans/s), used by c.
func buildScenario(name string, o options, capacity float64) (*scenario, error) {
	kinds := o.kinds
	rate := func(def float64) float64 {
		if o.rate > 0 {
			return o.rate
		}
		return def
	}
	workers := func(def int) int {
		if o.workers > 0 {
			return o.workers
		}
		return def
	}
	length := func(def time.Duration) time.Duration {
		if o.load > 0 {
			return o.load
		}
		return def
	}
	s := &scenario{name: name, throttle: func(bool) string { return "" }, cpus: defaultCPUs}
	switch name {
	case "a":
		s.stress = o.pulse
		if s.stress == stressCPU {
			s.title = fmt.Sprintf("short Opens, repeated: a CPU pulse of %s every %s over CPU lines under the quota", o.pulseHold, o.pulseEvery)
			s.throttle = underQuota.yaml
		} else {
			s.title = fmt.Sprintf("short Opens, repeated: a memory pulse of %s every %s against the shipped memory lines", o.pulseHold, o.pulseEvery)
		}
		s.load = length(75 * time.Second)
		for t := o.pulseFirst; t+o.pulseHold+10*time.Second <= s.load; t += o.pulseEvery {
			s.spells = append(s.spells, spell{t, o.pulseHold})
		}
		for _, k := range kinds {
			s.clients = append(s.clients, newClient(k, rate(1000), workers(4)))
		}
	case "b":
		s.title = fmt.Sprintf("an Open of %s: a CPU load over CPU lines set under the quota", o.openLength)
		s.stress, s.spells = stressCPU, []spell{{20 * time.Second, o.openLength}}
		s.load = length(20*time.Second + o.openLength + 40*time.Second)
		s.throttle = underQuota.yaml
		for _, k := range kinds {
			c := newClient(k, rate(500), workers(4))
			s.clients = append(s.clients, c)
		}
		// Every client whose whole budget is shorter than the Open, again
		// with the settings that let it wait (the agents retry for 5 min).
		for _, k := range kinds {
			c := newClient(k, rate(500), workers(4))
			if !c.isAgent() {
				s.clients = append(s.clients, c.lossless())
			}
		}
	case "c":
		s.factor = o.factor
		s.title = fmt.Sprintf("%g× the gateway's capacity for %s, shipped defaults", o.factor, length(5*time.Minute))
		s.load = length(5 * time.Minute)
		s.needsCapacity = true
		for _, k := range kinds {
			r := rate(o.factor * capacity / float64(len(kinds)))
			// Workers enough to offer that rate while refused and held
			// exports take seconds (the JS exporters fail exports beyond
			// 30 in flight: 16 stays under).
			s.clients = append(s.clients, newClient(k, r, workers(16)))
		}
	case "d":
		s.title = "the admission budget contended by large gzip bodies beside ordinary clients, shipped defaults"
		s.load = length(90 * time.Second)
		s.cpus = contendedCPUs
		for _, k := range kinds {
			s.clients = append(s.clients, newClient(k, rate(1000), workers(4)))
		}
		for _, k := range kinds {
			if k == goHTTP || k == goGRPC || k == jsHTTP {
				// About one large body a second from each, several in
				// flight at once against a 5 MiB budget.
				s.clients = append(s.clients, newClient(k, 0, 0).gzipLarge(rate(6000)))
			}
		}
	case "e", "e-throttle", "e-stock", "f", "f-throttle", "f-stock":
		// The backend: one spell of it from 20 s, the gateway's queue of
		// hungQueueSize, the variant's gateway.
		spellLen, variant := o.hang, name[1:]
		if name[0] == 'f' {
			spellLen = o.slow
		}
		s.spells = []spell{{20 * time.Second, spellLen}}
		s.load = length(20*time.Second + spellLen + 30*time.Second)
		s.queueSize, s.downstream, s.stock = hungQueueSize, variant == "", variant == "-stock"
		for _, k := range kinds {
			s.clients = append(s.clients, newClient(k, rate(1000), workers(4)))
		}
		if name[0] == 'e' {
			s.stress = stressBackend
			s.title = fmt.Sprintf("the backend hangs for %s, inside the SDKs' 10 s export budget; a queue of %d batches; %s", o.hang, hungQueueSize, backendGateways[variant])
			break
		}
		s.stress = stressSlow
		for _, c := range s.clients {
			s.sinkRate += o.slowShare * c.rate
		}
		s.title = fmt.Sprintf("the backend takes %.0f spans/s (%g of what the clients offer) for %s; a queue of %d batches; %s", s.sinkRate, o.slowShare, o.slow, hungQueueSize, backendGateways[variant])
	default:
		return nil, fmt.Errorf("-scenario %q: want %s", name, strings.Join(scenarioNames, ", "))
	}
	for i := range s.clients {
		s.clients[i].setID(i + 1)
	}
	return s, nil
}

// parseKinds parses -clients.
func parseKinds(s string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		return allKinds, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(allKinds, k) {
			return nil, fmt.Errorf("-clients: unknown client %q (want %s or all)", k, strings.Join(allKinds, ", "))
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out, nil
}

// parseScenarios parses -scenario.
func parseScenarios(s string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		return scenarioNames, nil
	}
	var out []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(scenarioNames, n) {
			return nil, fmt.Errorf("-scenario: unknown scenario %q (want %s or all)", n, strings.Join(scenarioNames, ", "))
		}
		out = append(out, n)
	}
	return out, nil
}
