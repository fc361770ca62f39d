// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"

import (
	"fmt"

	"github.com/otelthrottle/throttle/internal/decision"
)

// warnings are the messages the extension logs as warnings when it is
// created: one per setting that, valid as it is, turns a protection off, so
// that an operator sees on purpose what would otherwise go unnoticed.
func (cfg *Config) warnings() []string {
	var msgs []string
	if !cfg.Enabled {
		// Everything below is moot while nothing runs.
		return append(msgs, "`enabled` is false: the throttle is off, no check runs, every request is admitted and the receivers' shutdown cuts off no unfinished request")
	}
	if cfg.ObserveOnly {
		msgs = append(msgs, "`observe_only` is true: decisions are made and counted, but no request is refused")
	}
	if !cfg.Memory.Enabled {
		msgs = append(msgs, "`memory::enabled` is false: nothing is shed or refused for memory; only the OOM killer bounds it")
	}
	for s := range decision.NumSignals {
		if cfg.Rules.Rule(s).Enabled {
			continue
		}
		field := decision.RuleKeyDefault
		if r := cfg.Rules[s.String()]; r.Enabled != nil {
			field = s.String()
		}
		msgs = append(msgs, fmt.Sprintf("`rules::%s::enabled` is false: %s are exempt: admitted in every state short of the memory hard line (the receivers ramp them up again after it), and bounded by the admission budget, a quarter of which only exempt signals may take", field, s))
	}
	a := cfg.Admission
	if a.MaxInflightBytes.IsOff() {
		msgs = append(msgs, "`admission::max_inflight_bytes` is 0: the admission budget is off, nothing bounds the bytes admitted between two checks")
		return msgs // idle_timeout and the share bound the budget
	}
	if a.IdleTimeout == 0 {
		msgs = append(msgs, "`admission::idle_timeout` is 0: a client that stops sending keeps its share of the admission budget for as long as its connection stays open")
	}
	if a.Fairness.Share >= 1 {
		msgs = append(msgs, "`admission::fairness::share` is 1: one client key may hold the whole admission budget and refuse every other")
	}
	return msgs
}
