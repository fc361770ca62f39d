// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"fmt"
	"path"
	"strings"

	"github.com/otelthrottle/throttle/internal/decision"
)

// Routes maps requests to signals.
type Routes struct {
	// HTTP maps URL paths (e.g. "/prometheus/write") to signals.
	HTTP map[string]decision.Signal
	// GRPC maps gRPC full method names ("/package.Service/Method") to
	// signals.
	GRPC map[string]decision.Signal
}

// DefaultRoutes returns the built-in OTLP routes (otlpreceiver's default
// paths and the OTLP services' Export methods). The returned maps are fresh
// copies.
func DefaultRoutes() Routes {
	return Routes{
		HTTP: map[string]decision.Signal{
			"/v1/traces":              decision.Traces,
			"/v1/metrics":             decision.Metrics,
			"/v1/logs":                decision.Logs,
			"/v1development/profiles": decision.Profiles,
		},
		GRPC: map[string]decision.Signal{
			"/opentelemetry.proto.collector.trace.v1.TraceService/Export":                  decision.Traces,
			"/opentelemetry.proto.collector.metrics.v1.MetricsService/Export":              decision.Metrics,
			"/opentelemetry.proto.collector.logs.v1.LogsService/Export":                    decision.Logs,
			"/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export": decision.Profiles,
		},
	}
}

// Classifier tells which signal a request carries. It is immutable after
// NewClassifier and safe for concurrent use.
type Classifier struct {
	http map[string]decision.Signal
	grpc map[string]decision.Signal
	// maxHTTP is the longest HTTP route: a clean path longer than it cannot
	// match, so it is not even hashed.
	maxHTTP int
}

// NewClassifier returns a Classifier for the built-in OTLP routes plus user.
// A user route overrides a built-in one with the same key. HTTP routes must
// be absolute paths; they are stored cleaned (path.Clean), so "/a/" and "/a"
// are the same route, and two user routes that clean to the same path with
// different signals are an error. gRPC routes must have the form
// "/service/method".
func NewClassifier(user Routes) (*Classifier, error) {
	def := DefaultRoutes()
	c := &Classifier{http: def.HTTP, grpc: def.GRPC}
	userHTTP := make(map[string]string, len(user.HTTP))
	for route, s := range user.HTTP {
		if s >= decision.NumSignals {
			return nil, fmt.Errorf("http route %q: invalid signal %d", route, s)
		}
		if !strings.HasPrefix(route, "/") {
			return nil, fmt.Errorf("http route %q: must be an absolute path starting with /", route)
		}
		key := path.Clean(route)
		if prev, dup := userHTTP[key]; dup && user.HTTP[prev] != s {
			return nil, fmt.Errorf("http routes %q and %q are the same path %q with different signals", prev, route, key)
		}
		userHTTP[key] = route
		c.http[key] = s
	}
	for route, s := range user.GRPC {
		if s >= decision.NumSignals {
			return nil, fmt.Errorf("grpc route %q: invalid signal %d", route, s)
		}
		if !validFullMethod(route) {
			return nil, fmt.Errorf("grpc route %q: must be a full method name /package.Service/Method", route)
		}
		c.grpc[route] = s
	}
	for route := range c.http {
		c.maxHTTP = max(c.maxHTTP, len(route))
	}
	return c, nil
}

// validFullMethod reports whether m is "/service/method" with non-empty
// parts. grpc-go answers anything else Unimplemented before any stats
// handler sees it, so a malformed route could never be released on End.
func validFullMethod(m string) bool {
	rest, ok := strings.CutPrefix(m, "/")
	if !ok {
		return false
	}
	svc, method, ok := strings.Cut(rest, "/")
	return ok && svc != "" && method != "" && !strings.Contains(method, "/")
}

// HTTP classifies an HTTP request by its URL path. Pass r.URL.Path: the
// decoded path. The query is not part of it and so is ignored.
//
// The path is matched after cleaning (path.Clean semantics on a rooted
// path): "//v1/traces", "/v1/traces/", "/v1/./traces" and "/v1/x/../traces"
// all classify as traces. Matching is on the decoded path and RawPath is
// ignored, so "/v1%2Ftraces" also classifies as traces even though a
// segment-matching router (Go's ServeMux) would answer it 404: the error is
// on the safe side (such a request may be throttled; no request routed to an
// OTLP handler can escape classification by encoding tricks, because every
// router that reaches that handler sees the same decoded segments).
//
// An already clean path costs one scan and one map lookup and does not
// allocate; only an unclean path is cleaned (which allocates).
func (c *Classifier) HTTP(p string) (decision.Signal, bool) {
	if !isCleanPath(p) {
		if p == "" || p[0] != '/' {
			p = "/" + p
		}
		p = path.Clean(p)
	} else if len(p) > c.maxHTTP {
		return 0, false
	}
	s, ok := c.http[p]
	return s, ok
}

// GRPC classifies a gRPC call by its full method name, matched exactly.
// grpc-go routes on the exact :path too (a "//svc/method" is an unknown
// service to it), so no normalisation is needed or wanted.
func (c *Classifier) GRPC(fullMethod string) (decision.Signal, bool) {
	s, ok := c.grpc[fullMethod]
	return s, ok
}

// isCleanPath reports whether p is rooted and path.Clean(p) == p: no empty,
// "." or ".." segment and no trailing slash (except for "/"). Only the byte
// after each slash needs a look.
func isCleanPath(p string) bool {
	n := len(p)
	if n == 0 || p[0] != '/' {
		return false
	}
	// Jump from slash to slash (IndexByte is vectorised, which matters for
	// very long hostile paths).
	for i := 0; ; {
		switch {
		case i+1 == n: // trailing slash
			return n == 1
		case p[i+1] == '/': // empty segment
			return false
		case p[i+1] == '.':
			// "." or ".." segment; ".x", "..x" and "..." are ordinary names.
			if i+2 == n || p[i+2] == '/' {
				return false
			}
			if p[i+2] == '.' && (i+3 == n || p[i+3] == '/') {
				return false
			}
		}
		j := strings.IndexByte(p[i+1:], '/')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return true
}
