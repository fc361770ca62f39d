// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Command promote makes one run of a benchmark its baseline: it replaces
// bench/results/<baseline>/ with the run's report.md, summary.csv and at
// most three charts, and sets the baseline's row of bench/results/README.md
// (date, commit, command) from the report. Runs are written to bench/runs
// (git-ignored); only baselines are committed.
//
//	make promote RUN=bench/runs/2026-12-04-fleet-http BENCH=fleet-http
//	make promote RUN=bench/runs/2026-12-04-overload BENCH=overload-sweep CHARTS='timeline-D@4x-r1.png,timeline-D@4x+benchmark-r1.png'
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/otelthrottle/throttle/testbed/bench/report"
)

func main() {
	var p report.Promotion
	var charts string
	flag.StringVar(&p.Run, "run", "", "the run's folder (bench/runs/<date>-<name>)")
	flag.StringVar(&p.Baseline, "bench", "", "the baseline's folder in -results: overload-sweep, fleet-http, fleet-hung-http, soak, clients-a, clients-e, hostile, tier-http, autoscale-http, ...")
	flag.StringVar(&p.Results, "results", "bench/results", "the folder of the baselines and their index")
	flag.StringVar(&charts, "charts", "", fmt.Sprintf("comma-separated file names of the charts to keep, at most %d (default: all of the run's, when it has no more)", report.MaxBaselineCharts))
	flag.Parse()
	if p.Run == "" || p.Baseline == "" {
		fmt.Fprintln(os.Stderr, "promote: -run and -bench are required")
		flag.Usage()
		os.Exit(2)
	}
	for _, c := range strings.Split(charts, ",") {
		if c = strings.TrimSpace(c); c != "" {
			p.Charts = append(p.Charts, c)
		}
	}
	info, err := report.Promote(p)
	if err != nil {
		fmt.Fprintln(os.Stderr, "promote:", err)
		os.Exit(1)
	}
	dir := filepath.Join(p.Results, p.Baseline)
	fmt.Printf("%s is now the baseline in %s (%s, commit %s): git add -A %s %s\n",
		p.Run, dir, info.Date, info.Commit, dir, filepath.Join(p.Results, report.IndexFile))
}
