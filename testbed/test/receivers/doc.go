// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package receivers tests the throttle processor behind receivers that have
// no middlewares, with the real contrib receivers in an in-process
// collector: kafka against an in-process broker (franz-go's kfake), filelog
// on a file the test writes, and prometheus scraping a target the test
// serves. Each holds the throttle in Open (30 s by default) and measures
// what the receiver does with the refusals: whether it pauses and retries
// or drops, and how soon it catches up. They are integration tests of a
// minute each, behind the build tag e2e:
//
//	cd testbed && go test -tags e2e -count=1 -v ./test/receivers/
//
// -receivers.open=10s shortens the Open.
package receivers
