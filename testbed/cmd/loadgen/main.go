// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Command loadgen sends OTLP traces, metrics and logs to a collector on this
// machine in three phases (warmup, burst, bigpayload) and reports, per
// phase, what the collector answered. It never retries. See
// internal/loadgen for the flags' semantics.
//
//	go run ./cmd/loadgen -target http://127.0.0.1:4318 -c 32 -d 30s -csv out.csv
//	go run ./cmd/loadgen -protocol grpc -target 127.0.0.1:4317 -rate 400 -max-inflight 512
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/otelthrottle/throttle/testbed/internal/loadgen"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	cfg, err := loadgen.ParseFlags(args, os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	r, err := loadgen.New(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		return 2
	}
	if _, err := r.Run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "loadgen: interrupted:", err)
		return 1
	}
	return 0
}
