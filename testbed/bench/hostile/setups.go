// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"strings"
	"time"
)

// gatewaySettings are a round's gateway: its cgroup and the throttle's
// settings. The zero value is the run's -cpus and -mem-mib with the
// throttle's shipped defaults.
type gatewaySettings struct {
	cpus   float64
	memMiB uint64
	// throttle is the throttle extension's settings, YAML; "" is its
	// shipped defaults.
	throttle string
}

// String describes the gateway for the report, on one line.
func (g gatewaySettings) String() string {
	t := "shipped defaults"
	if g.throttle != "" {
		t = strings.Join(strings.Fields(g.throttle), " ")
	}
	return fmt.Sprintf("%g CPU, %d MiB, throttle: %s", g.cpus, g.memMiB, t)
}

// targetKind is what a scenario's round must reach: the criteria every
// scenario of one hostile peer is held to (targetCriteria), or the one
// figure a finding's fix is judged by.
type targetKind int8

const (
	// targetCriteria: the normal clients' throughput, budget stretches,
	// refusals on the hostile peer and no OOM kill (roundResult.check).
	targetCriteria targetKind = iota
	// targetNoOOM: the gateway is neither OOM-killed nor restarted.
	targetNoOOM
	// targetBatches: at least minBatchAccepted of the honest batch
	// client's requests are accepted.
	targetBatches
	// targetShutdown: the gateway exits within maxShutdown of its SIGTERM.
	targetShutdown
	// targetReserved: the budget's reservations stay within what the auto
	// budget assumes of the memory limit (limit/autoBudgetDivisor), and no
	// OOM kill.
	targetReserved
)

// The targets' bounds.
const (
	minBatchAccepted = 0.90
	maxShutdown      = 10 * time.Second
	// autoBudgetDivisor: the throttle's auto budget is at most the memory
	// limit divided by this (the extension's README), sized so that what
	// the admitted requests cost in memory fits in about half the limit.
	autoBudgetDivisor = 12
)

// setup is what a scenario's rounds need besides its hostile peer; the
// baseline round before it gets the same, so that the pair differs by the
// hostile peer alone.
type setup struct {
	gw gatewaySettings
	// batchBytes is the honest batch client's decoded batch size (0: none),
	// batchCycle the least time between two of its requests.
	batchBytes int
	batchCycle time.Duration
	target     targetKind
	// shutdown: the round's load phase ends -shutdown-after in, with a
	// SIGTERM to the gateway.
	shutdown bool
}

// The gateways of the findings that need one of their own.
const (
	// shrinkCPUs, shrinkMemMiB and shrinkBudget are the gateway the gRPC
	// size shrinking was found on.
	shrinkCPUs   = 1.5
	shrinkMemMiB = 1024
	shrinkBudget = "16MiB"
	// exemptMemMiB puts the auto budget at limit/12 = 10 MiB, the budget
	// of one CPU: the memory, not the cores, bounds it.
	exemptMemMiB = 120
)

// budgetYAML is the throttle's settings for an admission budget of size
// ("auto" or "" is the shipped default).
func budgetYAML(size string) string {
	if size == "" || size == "auto" {
		return ""
	}
	return "admission:\n  max_inflight_bytes: " + size
}

// setupFor returns scenario's setup under the run's options.
func setupFor(o *options, scenario string) setup {
	def := gatewaySettings{cpus: o.cpus, memMiB: o.memMiB}
	s := setup{gw: def}
	switch scenario {
	case scenarioGRPCShrink, scenarioGRPCShrinkControl:
		s.gw = gatewaySettings{cpus: shrinkCPUs, memMiB: shrinkMemMiB, throttle: budgetYAML(shrinkBudget)}
		s.target = targetNoOOM
	case scenarioLaneTrickle:
		// One batch a second: back to back, the batches and the normal
		// clients overloaded the one-CPU gateway without a hostile peer.
		s.batchBytes, s.batchCycle = o.laneBatchMiB<<20, o.laneBatchEvery
		s.target = targetBatches
	case scenarioSilentAddresses:
		s.gw.throttle = budgetYAML(o.silentBudget)
		s.batchBytes, s.batchCycle = o.silentBatchKiB<<10, minCycle
		s.target = targetBatches
	case scenarioShutdown:
		s.shutdown = true
		s.target = targetShutdown
	case scenarioExemptOverdraft:
		s.gw = gatewaySettings{cpus: 1, memMiB: exemptMemMiB, throttle: "rules:\n  metrics: { enabled: false }"}
		s.target = targetReserved
	default:
	}
	return s
}

// describe says what the target is, for the report.
func (k targetKind) describe() string {
	switch k {
	case targetNoOOM:
		return "0 OOM kills"
	case targetBatches:
		return fmt.Sprintf("honest batches >= %.0f %% accepted", 100*minBatchAccepted)
	case targetShutdown:
		return fmt.Sprintf("exit <= %s after SIGTERM", maxShutdown)
	case targetReserved:
		return fmt.Sprintf("peak reserved <= limit/%d, 0 OOM kills", autoBudgetDivisor)
	default:
		return ""
	}
}
