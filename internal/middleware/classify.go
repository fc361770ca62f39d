// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"errors"
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
			"/v1/traces":              decision.SignalTraces,
			"/v1/metrics":             decision.SignalMetrics,
			"/v1/logs":                decision.SignalLogs,
			"/v1development/profiles": decision.SignalProfiles,
		},
		GRPC: map[string]decision.Signal{
			"/opentelemetry.proto.collector.trace.v1.TraceService/Export":                  decision.SignalTraces,
			"/opentelemetry.proto.collector.metrics.v1.MetricsService/Export":              decision.SignalMetrics,
			"/opentelemetry.proto.collector.logs.v1.LogsService/Export":                    decision.SignalLogs,
			"/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export": decision.SignalProfiles,
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

// Errors of a route key, from CheckHTTPRoute and CheckGRPCRoute.
var (
	ErrRouteNotRooted = errors.New(`path must start with "/"`)
	ErrRouteQuery     = errors.New("path must not hold a query or fragment")
	ErrRouteUnclean   = errors.New("path must be clean")
	ErrRouteMethod    = errors.New(`want a full method name like "/pkg.Service/Method"`)
)

// CheckHTTPRoute returns why p cannot be a configured HTTP route, or nil: it
// must be a rooted, clean path without query or fragment. NewClassifier
// also takes an unclean path, which it stores cleaned.
func CheckHTTPRoute(p string) error {
	switch {
	case !strings.HasPrefix(p, "/"):
		return ErrRouteNotRooted
	case strings.ContainsAny(p, "?#"):
		return ErrRouteQuery
	case path.Clean(p) != p:
		return fmt.Errorf("%w, want %q", ErrRouteUnclean, path.Clean(p))
	}
	return nil
}

// CheckGRPCRoute returns why m cannot be a gRPC route, or nil: it must be a
// full method name, "/package.Service/Method", of protobuf identifier
// characters (the package is optional in gRPC, so "/Service/Method" is
// accepted too). grpc-go answers anything else Unimplemented before any
// stats handler sees it, so a malformed route could never be released on
// End.
func CheckGRPCRoute(m string) error {
	if !isFullMethod(m) {
		return ErrRouteMethod
	}
	return nil
}

func isFullMethod(m string) bool {
	rest, ok := strings.CutPrefix(m, "/")
	if !ok {
		return false
	}
	service, method, ok := strings.Cut(rest, "/")
	if !ok || service == "" || method == "" || strings.Contains(method, "/") {
		return false
	}
	if strings.HasPrefix(service, ".") || strings.HasSuffix(service, ".") || strings.Contains(service, "..") {
		return false
	}
	ident := func(s string, dots bool) bool {
		for _, c := range s {
			switch {
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
			case c == '.' && dots:
			default:
				return false
			}
		}
		return true
	}
	return ident(service, true) && ident(method, false)
}

// NewClassifier returns a Classifier for the built-in OTLP routes plus user.
// A user route overrides a built-in one with the same key. Routes must pass
// CheckHTTPRoute and CheckGRPCRoute, except that an HTTP route may be
// unclean: it is stored cleaned (path.Clean), so "/a/" and "/a" are the same
// route, and two user routes that clean to the same path with different
// signals are an error.
func NewClassifier(user Routes) (*Classifier, error) {
	def := DefaultRoutes()
	c := &Classifier{http: def.HTTP, grpc: def.GRPC}
	userHTTP := make(map[string]string, len(user.HTTP))
	for route, s := range user.HTTP {
		if s >= decision.NumSignals {
			return nil, fmt.Errorf("http route %q: invalid signal %d", route, s)
		}
		if err := CheckHTTPRoute(route); err != nil && !errors.Is(err, ErrRouteUnclean) {
			return nil, fmt.Errorf("http route %q: %w", route, err)
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
		if err := CheckGRPCRoute(route); err != nil {
			return nil, fmt.Errorf("grpc route %q: %w", route, err)
		}
		c.grpc[route] = s
	}
	for route := range c.http {
		c.maxHTTP = max(c.maxHTTP, len(route))
	}
	return c, nil
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
