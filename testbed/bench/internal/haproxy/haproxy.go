// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package haproxy runs HAProxy for the benchmarks that put a real proxy in
// front of their gateways (the tier's balancer, the tenants' HTTP proxy):
// it finds the binary, starts it in the foreground as a child of the
// harness with a configuration the benchmark rendered, and talks to its
// stats socket (statistics, runtime commands).
package haproxy // import "github.com/otelthrottle/throttle/testbed/bench/internal/haproxy"

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
	"time"

	"github.com/otelthrottle/throttle/testbed/bench/internal/harness"
)

// Find returns the path of the haproxy binary bin (a name looked up in
// PATH, or a path), or an error saying how to install it. A plain name is
// also looked for in /usr/sbin, where Debian installs it and which a
// non-root PATH often lacks.
func Find(bin string) (string, error) {
	p, err := exec.LookPath(bin)
	if err != nil && !strings.Contains(bin, "/") {
		p, err = exec.LookPath(filepath.Join("/usr/sbin", bin))
	}
	if err != nil {
		return "", fmt.Errorf("the proxy %q: %w (Debian: apt-get install haproxy)", bin, err)
	}
	return filepath.Abs(p)
}

// Config is what Start runs.
type Config struct {
	// Bin is the haproxy binary (see Find).
	Bin string
	// Render returns the configuration, given the path of the stats socket
	// it must declare (global: "stats socket <path> mode 600 level admin").
	Render func(socket string) ([]byte, error)
	// ConfigPath is where the configuration is written, LogPath where
	// HAProxy's output goes.
	ConfigPath, LogPath string
	// Logf reports its death; nil: silent.
	Logf func(format string, args ...any)
}

// Proxy is a running HAProxy.
type Proxy struct {
	Proc *harness.Process
	// Socket is the stats socket's path.
	Socket  string
	sockDir string
}

// Start writes the configuration, starts HAProxy in the foreground (-db,
// so that the PID is HAProxy's own and it is stopped by PID) and waits
// until its stats socket answers. On error, what it started is stopped.
func Start(ctx context.Context, cfg Config) (*Proxy, error) {
	// A unix socket's path is limited to 107 bytes: a short one in the
	// temporary folder rather than in the results folder.
	sockDir, err := os.MkdirTemp("", "bench-haproxy-")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Socket: filepath.Join(sockDir, "stats.sock"), sockDir: sockDir}
	b, err := cfg.Render(p.Socket)
	if err != nil {
		p.Stop()
		return nil, err
	}
	cfgPath, err := filepath.Abs(cfg.ConfigPath)
	if err == nil {
		err = os.WriteFile(cfgPath, b, 0o644)
	}
	if err != nil {
		p.Stop()
		return nil, err
	}
	if p.Proc, err = harness.StartProcess(harness.ProcessConfig{
		Bin: cfg.Bin, Args: []string{"-db", "-f", cfgPath}, LogPath: cfg.LogPath, Logf: cfg.Logf,
	}); err != nil {
		p.Stop()
		return nil, fmt.Errorf("starting haproxy: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := p.Command("show info", func(r io.Reader) error {
			_, err := io.Copy(io.Discard, r)
			return err
		})
		if err == nil {
			return p, nil
		}
		if _, alive, _ := p.Proc.State(); !alive || time.Now().After(deadline) || ctx.Err() != nil {
			p.Stop()
			return nil, errors.Join(fmt.Errorf("haproxy did not start (see %s)", cfg.LogPath), err, ctx.Err())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops HAProxy (SIGTERM to its PID, SIGKILL after 2 s) and removes
// its socket's folder.
func (p *Proxy) Stop() {
	if p.Proc != nil {
		p.Proc.Stop(2 * time.Second)
	}
	_ = os.RemoveAll(p.sockDir)
}

// Command sends one command to the stats socket and hands its answer to
// read.
func (p *Proxy) Command(cmd string, read func(io.Reader) error) error {
	c, err := net.DialTimeout("unix", p.Socket, time.Second)
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

// ServerStats is what HAProxy counted of one server of a backend.
type ServerStats struct {
	// Status is the server's health (UP, DOWN, ...).
	Status string
	// Conns is the connections open to it now, ConnsTotal all it was
	// given. (Its byte counts are left out: HAProxy adds a connection's
	// bytes when it ends, and a gRPC client's lasts the whole run.)
	Conns, ConnsTotal float64
}

// Stats reads the statistics of backend's servers from the stats socket,
// by server name.
func (p *Proxy) Stats(backend string) (map[string]ServerStats, error) {
	var out map[string]ServerStats
	err := p.Command("show stat", func(r io.Reader) (err error) {
		out, err = ParseStats(bufio.NewReader(r), backend)
		return err
	})
	return out, err
}

// SetReady puts server into rotation in backend (HAProxy's runtime API,
// "set server <backend>/<server> state ready").
func (p *Proxy) SetReady(backend, server string) error {
	return p.Command(fmt.Sprintf("set server %s/%s state ready", backend, server), func(r io.Reader) error {
		// It answers nothing when it did it, else why not.
		b, err := io.ReadAll(r)
		if msg := strings.TrimSpace(string(b)); msg != "" {
			return fmt.Errorf("haproxy: set server %s/%s state ready: %s", backend, server, msg)
		}
		return err
	})
}

// ParseStats parses the CSV of HAProxy's "show stat" (a header line "#
// pxname,svname,...", one line per frontend, backend and server) into the
// servers of backend.
func ParseStats(r io.Reader, backend string) (map[string]ServerStats, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("haproxy stats: %w", err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(strings.TrimPrefix(h, "#"))] = i
	}
	for _, need := range []string{"pxname", "svname", "status", "scur", "stot"} {
		if _, ok := col[need]; !ok {
			return nil, fmt.Errorf("haproxy stats: no %s column", need)
		}
	}
	out := map[string]ServerStats{}
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("haproxy stats: %w", err)
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
		out[cell("svname")] = ServerStats{Status: cell("status"), Conns: num("scur"), ConnsTotal: num("stot")}
	}
	return out, nil
}
