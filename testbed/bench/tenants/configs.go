// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"text/template"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
)

// tenantHeader is the header each agent's exporter sends its tenant in,
// and tenantAttr the resource attribute its items carry it in (set by the
// load generator in front of the agent, as the tenant's SDK would), which
// the sink counts items by.
const (
	tenantHeader = "x-tenant"
	tenantAttr   = "tenant"
)

// tenantName is the name of tenant i (from 0): tenant-1, tenant-2, ...
func tenantName(i int) string { return fmt.Sprintf("tenant-%d", i+1) }

// The loopback addresses: tenant i's agent reaches the gateway (or the
// proxy) from 127.0.0.(2+i), the proxy reaches the gateway from
// proxyAddr, so that each tenant is an address of its own where the
// topology has no proxy, and every request comes from the proxy's one
// address where it has one.
const (
	firstTenantAddr = 2
	proxyAddrByte   = 20
	// maxTenants keeps the tenants' addresses below the proxy's.
	maxTenants = proxyAddrByte - firstTenantAddr
)

var proxyAddr = netip.MustParseAddr(fmt.Sprintf("127.0.0.%d", proxyAddrByte))

// tenantAddr is the source address of tenant i's agent (i < maxTenants).
func tenantAddr(i int) netip.Addr {
	return netip.MustParseAddr(fmt.Sprintf("127.0.0.%d", firstTenantAddr+i))
}

// gateway is one gateway under test: a kind of colconfig and, for the
// throttle, its settings.
type gateway struct {
	name string
	kind string
	// throttle is the throttle extension's settings ("" = {}, the shipped
	// defaults).
	throttle string
	// proxyOnly: the gateway differs from another only behind the proxy
	// (trusted_proxies names the proxy's address), so it runs there only.
	proxyOnly bool
}

// gateways are the gateways compared, in the order they run.
var gateways = []gateway{
	{name: "throttle-address", kind: colconfig.KindThrottle},
	{
		name: "throttle-tenant", kind: colconfig.KindThrottle,
		throttle: "admission:\n  fairness: { key: header, header: " + tenantHeader + " }",
	},
	{
		name: "throttle-forwarded", kind: colconfig.KindThrottle, proxyOnly: true,
		throttle: "admission:\n  fairness: { key: address, trusted_proxies: [\"" + proxyAddr.String() + "\"] }",
	},
	{name: colconfig.KindStock, kind: colconfig.KindStock},
	{name: colconfig.KindMLExt, kind: colconfig.KindMLExt},
}

// The topologies.
const (
	// topoProxy: agents -> HAProxy (HTTP mode, X-Forwarded-For) -> gateway.
	topoProxy = "proxy"
	// topoDirect: each agent -> gateway from its own address.
	topoDirect = "direct"
)

var topologies = []string{topoProxy, topoDirect}

// parseGateways parses -gateways: names from gateways, or all.
func parseGateways(s string) ([]gateway, error) {
	if strings.TrimSpace(s) == "all" {
		return slices.Clone(gateways), nil
	}
	var out []gateway
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		i := slices.IndexFunc(gateways, func(g gateway) bool { return g.name == n })
		if i < 0 {
			return nil, fmt.Errorf("-gateways: unknown gateway %q (want %s, or all)", n, strings.Join(gatewayNames(), ", "))
		}
		out = append(out, gateways[i])
	}
	return out, nil
}

func gatewayNames() []string {
	var out []string
	for _, g := range gateways {
		out = append(out, g.name)
	}
	return out
}

// parseTopologies parses -topologies: proxy, direct, or all.
func parseTopologies(s string) ([]string, error) {
	if strings.TrimSpace(s) == "all" {
		return slices.Clone(topologies), nil
	}
	var out []string
	for _, n := range strings.Split(s, ",") {
		n = strings.TrimSpace(n)
		if !slices.Contains(topologies, n) {
			return nil, fmt.Errorf("-topologies: unknown topology %q (want proxy, direct, or all)", n)
		}
		out = append(out, n)
	}
	return out, nil
}

// pair is one gateway in one topology: a baseline round and a noisy round.
type pair struct {
	topology string
	gw       gateway
}

// name is the pair's name in file names and tables: proxy-throttle-tenant.
func (p pair) name() string { return p.topology + "-" + p.gw.name }

// pairs is the run's matrix, topology by topology, in the gateways' order,
// without the gateways that differ only behind the proxy where there is
// none.
func pairs(topos []string, gws []gateway) []pair {
	var out []pair
	for _, t := range topos {
		for _, g := range gws {
			if g.proxyOnly && t != topoProxy {
				continue
			}
			out = append(out, pair{topology: t, gw: g})
		}
	}
	return out
}

// The rounds of a pair.
const (
	roundBaseline = "baseline" // the quiet tenants only
	roundNoisy    = "noisy"    // the quiet tenants and the noisy one
	roundCapacity = "capacity" // the capacity measurement (every tenant alike)
)

// proxyConfig is the proxy in front of the gateway: HAProxy in HTTP mode,
// as an ingress or an L7 balancer, which adds X-Forwarded-For with the
// client's address, reuses its connections to the gateway for any client
// (http-reuse safe, HAProxy's default) and connects from Source alone.
type proxyConfig struct {
	Socket              string
	Port, GatewayPort   int
	Source              string
	TimeoutClientServer string
}

var proxyTmpl = template.Must(template.New("haproxy").Parse(`# Written by bench/tenants: the proxy in front of the gateway.
global
  maxconn 4096
  stats socket {{ .Socket }} mode 600 level admin

defaults
  mode http
  option forwardfor
  option http-keep-alive
  timeout connect 2s
  timeout http-request 30s
  timeout http-keep-alive 30s
  timeout client {{ .TimeoutClientServer }}
  timeout server {{ .TimeoutClientServer }}

frontend otlp_http
  bind 127.0.0.1:{{ .Port }}
  default_backend gateway

backend gateway
  source {{ .Source }}
  server gateway 127.0.0.1:{{ .GatewayPort }}
`))

// proxyTimeout is the proxy's client and server timeout: beyond the
// agents' exporter timeout (30 s), so that the agent, not the proxy, gives
// up on a slow answer.
const proxyTimeout = "60s"
