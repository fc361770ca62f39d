// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// runOutcome is what one scenario's run found.
type runOutcome struct {
	Clients []clientOutcome
	Opens   []openSpell
	// Stress: when the memory pulses or the CPU load ran (seconds on the
	// timeline).
	Stress   [][2]float64
	Drained  bool
	Load     time.Duration
	Restarts int
	OOMKills float64
	// Gateway: its exporter's failures towards the sink (spans).
	GatewaySendFailed, GatewayEnqueueFailed float64
	// GatewayRefused: spans the gateway's receiver refused after decoding
	// them (the throttle's refusals come before and are not counted).
	GatewayRefused float64
	Foreign        uint64
	// SinkSlowest: the sink's slowest answer; GatewayLog: the gateway's
	// warnings, errors and exporter retries, by folded text.
	SinkSlowest time.Duration
	GatewayLog  map[string]uint64
	Points      []point
}

// clientOutcome is one client's counts.
type clientOutcome struct {
	Spec clientSpec
	// Result is what the client process reported (nil: none, ResultErr
	// says why).
	Result    *result
	ResultErr error
	Killed    bool
	Tally     tallyOf
	// GivenUp: what the exporter reported as given up (an agent: its
	// send_failed and enqueue_failed spans).
	GivenUp uint64
	Agent   *agentCounts
	// Logs: what the client logged, by folded text (the exporter's errors
	// first, then its library's log; an agent: its warnings and errors).
	Errors, Logs map[string]uint64
}

// agentCounts are an agent's own counters at the end of the run.
type agentCounts struct {
	Accepted, Refused, Sent, SendFailed, EnqueueFailed float64
}

// Handed is what the application handed to the exporter.
func (c clientOutcome) Handed() uint64 {
	if c.Result == nil {
		return 0
	}
	return c.Result.Handed
}

// Lost is what is missing at the sink: given up or lost after acceptance.
func (c clientOutcome) Lost() uint64 { return c.Tally.Missing }

// collect counts every client against the sink and reads the gateway's and
// the agents' final counters.
func (m *matrix) collect() *runOutcome {
	out := &runOutcome{Points: m.rec.snapshot()}
	out.Opens = opens(out.Points)
	out.Stress = stressSpells(out.Points)
	_, _, out.Restarts = m.gw.Proc.State()
	if st, err := m.cg.Stats(); err == nil {
		out.OOMKills = float64(st.OOMKills)
	}
	gs, _ := m.gw.Scraper.Get()
	out.GatewaySendFailed = zero(harness.Value(gs, "otelcol_exporter_send_failed_spans", nil))
	out.GatewayEnqueueFailed = zero(harness.Value(gs, "otelcol_exporter_enqueue_failed_spans", nil))
	out.GatewayRefused = zero(harness.Value(gs, "otelcol_receiver_refused_spans", nil))
	m.sink.mu.Lock()
	out.Foreign = m.sink.foreign
	out.SinkSlowest = m.sink.slowest
	m.sink.mu.Unlock()
	out.GatewayLog = collectorLog(m.path("log-gateway.txt"))
	for _, p := range m.clients {
		c := clientOutcome{Spec: p.spec, Killed: p.killed}
		c.Result, c.ResultErr = readResult(p.resultPath)
		if c.Result == nil && c.ResultErr == nil {
			c.ResultErr = errNoResult
		}
		if c.Result != nil {
			c.Tally = m.sink.count(c.Result)
			c.GivenUp = c.Result.GivenUp
			c.Errors, c.Logs = refold(c.Result.Errors), refold(c.Result.Logs)
		}
		if a := m.agents[p.spec.id]; a != nil {
			s, _ := a.col.Scraper.Get()
			c.Agent = &agentCounts{
				Accepted:      zero(harness.Value(s, "otelcol_receiver_accepted_spans", nil)),
				Refused:       zero(harness.Value(s, "otelcol_receiver_refused_spans", nil)),
				Sent:          zero(harness.Value(s, "otelcol_exporter_sent_spans", nil)),
				SendFailed:    zero(harness.Value(s, "otelcol_exporter_send_failed_spans", nil)),
				EnqueueFailed: zero(harness.Value(s, "otelcol_exporter_enqueue_failed_spans", nil)),
			}
			c.GivenUp = uint64(c.Agent.SendFailed + c.Agent.EnqueueFailed)
			// The feeder's refusals are the agent's receiver's, not its
			// exporter's: what the report shows is the agent's own log.
			c.Errors, c.Logs = nil, collectorLog(a.logPath)
		}
		out.Clients = append(out.Clients, c)
	}
	return out
}

// refold folds the digits of messages the node client counted raw.
func refold(m map[string]uint64) map[string]uint64 {
	if len(m) == 0 {
		return nil
	}
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[foldDigits(k)] += v
	}
	return out
}

// collectorLog counts the warnings, errors and exporter retries of a
// collector's log (the console encoding: time, level, caller, message,
// JSON fields, tab separated) by message and error, digits folded.
func collectorLog(path string) map[string]uint64 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]uint64{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if k := collectorLogLine(sc.Text()); k != "" {
			out[k]++
		}
	}
	return out
}

// collectorLogLine is the report's text of one log line of a collector,
// "" for a line the report leaves out (not a warning or error, nor an
// exporter's retry).
func collectorLogLine(line string) string {
	f := strings.Split(line, "\t")
	if len(f) < 4 {
		return ""
	}
	level, msg := f[1], f[3]
	if level != "warn" && level != "error" && !strings.Contains(msg, "Exporting failed") {
		return ""
	}
	text := level + ": " + msg
	if len(f) >= 5 {
		var fields map[string]any
		if json.Unmarshal([]byte(f[len(f)-1]), &fields) == nil {
			if e, ok := fields["error"]; ok {
				text += ": " + fmt.Sprint(e)
			}
		}
	}
	return foldDigits(text)
}
