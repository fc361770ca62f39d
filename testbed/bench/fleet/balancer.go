// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bufio"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/colconfig"
	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// balancerConfig is the tier's balancer: HAProxy in TCP mode with
// round-robin, which hands each new connection to the next replica as
// kube-proxy does, one frontend per OTLP protocol. A replica whose port
// refuses connections is taken out after two failed checks a second apart
// and back in after one good one, as a readiness probe takes a restarting
// pod out of a Service's endpoints; a connection that fails to reach a
// replica is tried on another (redispatch). The idle timeouts are long:
// kube-proxy ends no idle connection, and a gRPC agent keeps its one
// connection for as long as it can.
type balancerConfig struct {
	HTTPPort, GRPCPort int
	// Socket is the stats socket's path.
	Socket   string
	Replicas []balancerServer
}

// balancerServer is one replica as the balancer knows it.
type balancerServer struct {
	Name               string
	HTTPPort, GRPCPort int
	// Disabled starts it out of rotation (maintenance), as a pod not yet
	// in a Service's endpoints, until setReady.
	Disabled bool
}

// The backends' names in the balancer's configuration and statistics.
const (
	backendHTTP = "gateways_http"
	backendGRPC = "gateways_grpc"
)

var balancerTmpl = template.Must(template.New("haproxy").Parse(`# Written by bench/fleet (tier): the balancer in front of the replicas.
global
  maxconn 4096
  stats socket {{ .Socket }} mode 600 level admin

defaults
  mode tcp
  balance roundrobin
  timeout connect 2s
  timeout client 1h
  timeout server 1h
  retries 2
  option redispatch
  default-server check inter 1s fall 2 rise 1

frontend otlp_http
  bind 127.0.0.1:{{ .HTTPPort }}
  default_backend ` + backendHTTP + `

frontend otlp_grpc
  bind 127.0.0.1:{{ .GRPCPort }}
  default_backend ` + backendGRPC + `

backend ` + backendHTTP + `
{{- range .Replicas }}
  server {{ .Name }} 127.0.0.1:{{ .HTTPPort }}{{ if .Disabled }} disabled{{ end }}
{{- end }}

backend ` + backendGRPC + `
{{- range .Replicas }}
  server {{ .Name }} 127.0.0.1:{{ .GRPCPort }}{{ if .Disabled }} disabled{{ end }}
{{- end }}
`))

// balancer is the running HAProxy.
type balancer struct {
	proc   *harness.Process
	socket string
	// backend is the backend of the protocol the agents use.
	backend            string
	HTTPPort, GRPCPort int
}

// findHAProxy returns the path of the haproxy binary bin (a name looked up
// in PATH, or a path), or an error saying how to install it.
// A plain name is also looked for in /usr/sbin, where Debian installs it
// and which a non-root PATH often lacks.
func findHAProxy(bin string) (string, error) {
	p, err := exec.LookPath(bin)
	if err != nil && !strings.Contains(bin, "/") {
		p, err = exec.LookPath(filepath.Join("/usr/sbin", bin))
	}
	if err != nil {
		return "", fmt.Errorf("the balancer %q: %w (Debian: apt-get install haproxy)", bin, err)
	}
	return filepath.Abs(p)
}

// startBalancer starts HAProxy (the binary bin) in front of replicas on
// fresh ports, in the foreground as a child of this process (stopped by
// PID with the group), and waits until its stats socket answers.
func (g *group) startBalancer(ctx context.Context, bin string, replicas []balancerServer) (*balancer, error) {
	ports, err := harness.FreePorts(2)
	if err != nil {
		return nil, err
	}
	// A unix socket's path is limited to 107 bytes: a short one in the
	// temporary folder rather than in the results folder.
	sockDir, err := os.MkdirTemp("", "tier-lb-")
	if err != nil {
		return nil, err
	}
	g.cleanups = append(g.cleanups, func() { _ = os.RemoveAll(sockDir) })
	cfg := balancerConfig{HTTPPort: ports[0], GRPCPort: ports[1], Socket: filepath.Join(sockDir, "stats.sock"), Replicas: replicas}
	b, err := colconfig.Render(balancerTmpl, cfg)
	if err != nil {
		return nil, err
	}
	cfgPath, _ := filepath.Abs(filepath.Join(g.o.out, fmt.Sprintf("config-%s-balancer.cfg", g.name)))
	if err := os.WriteFile(cfgPath, b, 0o644); err != nil {
		return nil, err
	}
	// -db: stay in the foreground, so that the PID is HAProxy's own.
	p, err := harness.StartProcess(harness.ProcessConfig{
		Bin: bin, Args: []string{"-db", "-f", cfgPath},
		LogPath: filepath.Join(g.o.out, fmt.Sprintf("log-%s-balancer.txt", g.name)), Logf: logf,
	})
	if err != nil {
		return nil, fmt.Errorf("starting the balancer: %w", err)
	}
	g.cleanups = append(g.cleanups, func() { p.Stop(2 * time.Second) })
	lb := &balancer{proc: p, socket: cfg.Socket, backend: backendHTTP, HTTPPort: cfg.HTTPPort, GRPCPort: cfg.GRPCPort}
	if g.o.protocol == "grpc" {
		lb.backend = backendGRPC
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := lb.stats()
		if err == nil {
			return lb, nil
		}
		if _, alive, _ := p.State(); !alive || time.Now().After(deadline) || ctx.Err() != nil {
			return nil, errors.Join(fmt.Errorf("the balancer did not start (see log-%s-balancer.txt)", g.name), err, ctx.Err())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// serverStats is what the balancer counted of one replica.
type serverStats struct {
	// Status is the replica's health (UP, DOWN, ...).
	Status string
	// Conns is the connections open to it now, ConnsTotal all it was
	// given. (Its byte counts are left out: HAProxy adds a connection's
	// bytes when it ends, and a gRPC agent's lasts the whole run.)
	Conns, ConnsTotal float64
}

// stats reads the statistics of the agents' backend's servers from the
// stats socket, by server name.
func (lb *balancer) stats() (map[string]serverStats, error) {
	var out map[string]serverStats
	err := lb.command("show stat", func(r io.Reader) (err error) {
		out, err = parseStats(bufio.NewReader(r), lb.backend)
		return err
	})
	return out, err
}

// command sends one command to the stats socket and hands its answer to
// read.
func (lb *balancer) command(cmd string, read func(io.Reader) error) error {
	c, err := net.DialTimeout("unix", lb.socket, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := io.WriteString(c, cmd+"\n"); err != nil {
		return err
	}
	return read(c)
}

// setReady puts the replica server into rotation in both backends
// (HAProxy's runtime API, "set server <backend>/<server> state ready"), as
// a pod that turns ready joins a Service's endpoints.
func (lb *balancer) setReady(server string) error {
	for _, backend := range []string{backendHTTP, backendGRPC} {
		err := lb.command(fmt.Sprintf("set server %s/%s state ready", backend, server), func(r io.Reader) error {
			// It answers nothing when it did it, else why not.
			b, err := io.ReadAll(r)
			if msg := strings.TrimSpace(string(b)); msg != "" {
				return fmt.Errorf("balancer: set server %s/%s state ready: %s", backend, server, msg)
			}
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// parseStats parses the CSV of HAProxy's "show stat" (a header line "#
// pxname,svname,...", one line per frontend, backend and server) into the
// servers of backend.
func parseStats(r io.Reader, backend string) (map[string]serverStats, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("balancer stats: %w", err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(strings.TrimPrefix(h, "#"))] = i
	}
	for _, need := range []string{"pxname", "svname", "status", "scur", "stot"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("balancer stats: no %s column", need)
		}
	}
	out := map[string]serverStats{}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("balancer stats: %w", err)
		}
		cell := func(name string) string {
			if i := col[name]; i < len(rec) {
				return rec[i]
			}
			return ""
		}
		if cell("pxname") != backend || cell("svname") == "BACKEND" || cell("svname") == "FRONTEND" {
			continue
		}
		num := func(name string) float64 {
			v, _ := strconv.ParseFloat(cell(name), 64)
			return v
		}
		out[cell("svname")] = serverStats{Status: cell("status"), Conns: num("scur"), ConnsTotal: num("stot")}
	}
	return out, nil
}
