package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"text/template"
	"time"
)

// colConfig fills the collector configuration of a scenario.
type colConfig struct {
	GRPCPort, HTTPPort, MetricsPort int
	// Throttle: the throttle extension on both OTLP receivers.
	Throttle bool
	// Thresholds: "default" (SPEC section 8) or "benchmark" (the original
	// design's 0x08 a).
	Thresholds string
	// ThrottleYAML, when set, replaces the throttle extension's settings
	// (the lines under extensions.throttle, at any indentation): for
	// experiments such as shedding everything to measure the cost of a
	// rejection.
	ThrottleYAML string
	// MemoryLimiter: the stock memory_limiter processor first in every
	// pipeline.
	MemoryLimiter bool
	// PprofPort, when not 0: contrib's pprof extension on 127.0.0.1 at this
	// port, for the goroutine count of the timeline (-pprof).
	PprofPort int
}

// The pipeline is otlp -> [memory_limiter] -> batch -> nop: the receiver's
// decoding and the batch processor are the work under test, and the nop
// exporter keeps the sink free (an exporter to a local sink would share the
// machine's CPUs with the collector and the generator, and measure the
// sink). Metrics are exempt from throttling (SPEC section 10): the harness
// checks that they lose nothing.
var configTmpl = template.Must(template.New("config").Funcs(template.FuncMap{"split": strings.Fields, "indent": indent4}).Parse(`# Written by bench/overload; one scenario's collector.
{{- if or .Throttle .PprofPort }}
extensions:
{{- end }}
{{- if .Throttle }}
  throttle:
{{- if .ThrottleYAML }}
{{ indent .ThrottleYAML }}
{{- else if eq .Thresholds "benchmark" }}
    # The original design's benchmark thresholds (0x08 a).
    sample_interval: 250ms
    signal: { cpu_slow_beta: 0.95, cpu_fast_beta: 0.7, fallback_cores: 1 }
    thresholds:
      cpu: { enabled: true, enter: 0.85, exit: 0.70, hard: 1.20, breach_n: 3 }
      mem: { enabled: true, enter: 0.70, exit: 0.60, hard: 0.80, breach_n: 1 }
    rules:
      default: { drop_min: 0.0, drop_max: 0.2 }
      metrics: { enabled: false }
{{- else }}
    # The defaults (SPEC section 8), metrics exempt.
    rules:
      metrics: { enabled: false }
{{- end }}
{{- end }}
{{- if .PprofPort }}
  # Go's pprof: the harness reads the goroutine count from it.
  pprof:
    endpoint: 127.0.0.1:{{ .PprofPort }}
{{- end }}

receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:{{ .GRPCPort }}
{{- if .Throttle }}
        middlewares: [{ id: throttle }]
{{- end }}
      http:
        endpoint: 127.0.0.1:{{ .HTTPPort }}
{{- if .Throttle }}
        middlewares: [{ id: throttle }]
{{- end }}

processors:
{{- if .MemoryLimiter }}
  memory_limiter:
    check_interval: 1s
    limit_percentage: 80
    spike_limit_percentage: 25
{{- end }}
  batch: {}

exporters:
  nop: {}

service:
{{- if or .Throttle .PprofPort }}
  extensions: [{{ if .Throttle }}throttle{{ end }}{{ if and .Throttle .PprofPort }}, {{ end }}{{ if .PprofPort }}pprof{{ end }}]
{{- end }}
  pipelines:
{{- range $p := (split "traces metrics logs") }}
    {{ $p }}:
      receivers: [otlp]
      processors: [{{ if $.MemoryLimiter }}memory_limiter, {{ end }}batch]
      exporters: [nop]
{{- end }}
  telemetry:
    logs:
      level: info
    metrics:
      level: normal
      readers:
        - pull:
            exporter:
              prometheus:
                host: 127.0.0.1
                port: {{ .MetricsPort }}
                without_scope_info: true
                without_units: true
                without_type_suffix: true
`))

func renderConfig(c colConfig) ([]byte, error) {
	var b bytes.Buffer
	err := configTmpl.Execute(&b, c)
	return b.Bytes(), err
}

// freePort asks the kernel for a free port on 127.0.0.1.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// collector runs the collector binary in the cgroup and restarts it when it
// dies, as a kubelet would (with a short fixed delay instead of the
// kubelet's growing back-off, so that a 60 s run sees the crash loop).
type collector struct {
	bin, cfgPath, logPath string
	cg                    *cgroup
	restartDelay          time.Duration
	logf                  func(format string, args ...any)

	mu       sync.Mutex
	pid      int
	alive    bool
	restarts int
	exits    []string
	stopping bool
	stopCh   chan struct{}
	done     chan struct{}
}

// startCollector starts the first process and the supervisor.
func startCollector(bin, cfgPath, logPath string, cg *cgroup, restartDelay time.Duration, logf func(string, ...any)) (*collector, error) {
	c := &collector{bin: bin, cfgPath: cfgPath, logPath: logPath, cg: cg, restartDelay: restartDelay, logf: logf,
		stopCh: make(chan struct{}), done: make(chan struct{})}
	cmd, err := c.spawn()
	if err != nil {
		return nil, err
	}
	go c.supervise(cmd)
	return c, nil
}

// spawn starts one collector process inside the cgroup: a shell writes its
// own PID into the cgroup's procs files, then execs the collector, which so
// starts (and allocates) inside the limits with the same PID.
func (c *collector) spawn() (*exec.Cmd, error) {
	logf, err := os.OpenFile(c.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== bench/overload: starting %s at %s\n", c.bin, time.Now().UTC().Format(time.RFC3339Nano))
	script := `for f in $OVERLOAD_CGROUP_PROCS; do echo $$ > "$f" || exit 97; done; exec "$@"`
	cmd := exec.Command("/bin/sh", "-c", script, "sh", c.bin, "--config", c.cfgPath)
	cmd.Env = append(os.Environ(), "OVERLOAD_CGROUP_PROCS="+strings.Join(c.cg.procsFiles(), " "))
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a Ctrl-C on the terminal reaches the harness only,
	// which then stops the collector itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.pid, c.alive = cmd.Process.Pid, true
	c.mu.Unlock()
	return cmd, nil
}

func (c *collector) supervise(cmd *exec.Cmd) {
	defer close(c.done)
	for {
		err := cmd.Wait()
		c.mu.Lock()
		c.alive = false
		stopping := c.stopping
		desc := "exited"
		if err != nil {
			desc = err.Error()
		}
		c.exits = append(c.exits, fmt.Sprintf("%s pid %d: %s", time.Now().UTC().Format("15:04:05.000"), c.pid, desc))
		c.mu.Unlock()
		if stopping {
			return
		}
		c.logf("collector pid %d died (%s); restarting in %s", cmd.Process.Pid, desc, c.restartDelay)
		select {
		case <-c.stopCh:
			return
		case <-time.After(c.restartDelay):
		}
		c.mu.Lock()
		if c.stopping {
			c.mu.Unlock()
			return
		}
		c.restarts++
		c.mu.Unlock()
		next, err := c.spawn()
		if err != nil {
			c.logf("restarting the collector: %v", err)
			return
		}
		cmd = next
	}
}

// state returns the current PID, whether it runs, and the restarts so far.
func (c *collector) state() (pid int, alive bool, restarts int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.pid, c.alive, c.restarts
}

// stop ends the collector: SIGTERM to its PID, SIGKILL after grace.
func (c *collector) stop(grace time.Duration) {
	c.mu.Lock()
	if c.stopping {
		c.mu.Unlock()
		<-c.done
		return
	}
	c.stopping = true
	close(c.stopCh)
	pid, alive := c.pid, c.alive
	c.mu.Unlock()
	if alive {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		select {
		case <-c.done:
			return
		case <-time.After(grace):
			c.logf("collector pid %d did not stop in %s: SIGKILL", pid, grace)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	<-c.done
}

// waitReady waits for the collector's metrics endpoint to answer.
func waitReady(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, http.NoBody)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return errors.Join(fmt.Errorf("collector not ready at %s", url), err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// indent4 re-indents a YAML block by four spaces.
func indent4(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n")
}
