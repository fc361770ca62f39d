// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package throttleextension sheds load at the receivers' entrance, before a
// request body is read or decoded, driven by the collector's own CPU and
// memory water level read from its container's cgroup.
//
// Receivers reference it through the middlewares list of their confighttp or
// configgrpc server settings; the throttle processor asks it for decisions
// inside pipelines.
package throttleextension // import "github.com/otelthrottle/throttle/extension/throttleextension"
