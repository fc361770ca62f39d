// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// FreePort returns a port on 127.0.0.1 that nothing listens on, below the
// kernel's range of ephemeral ports: a port from that range (what a
// listener on port 0 gets) can be taken by an outgoing connection between
// the moment it is chosen and the moment a collector binds it, and a
// benchmark makes thousands of connections.
func FreePort() (int, error) {
	low, high := 20000, 32767
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 1024 {
				high = n - 1
				low = min(low, high-1000)
			}
		}
	}
	portMu.Lock()
	defer portMu.Unlock()
	for range 1000 {
		p := low + rand.IntN(high-low+1)
		if portsGiven[p] {
			continue
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		l.Close()
		portsGiven[p] = true
		return p, nil
	}
	return 0, errors.New("no free port below the ephemeral range")
}

// FreePorts returns n ports from FreePort.
func FreePorts(n int) ([]int, error) {
	out := make([]int, n)
	for i := range out {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		out[i] = p
	}
	return out, nil
}

// portsGiven: a port is handed out once per harness process, so that two
// collectors started in a row never get the same one.
var (
	portMu     sync.Mutex
	portsGiven = map[int]bool{}
)

// ProcessConfig describes a process the harness runs and watches.
type ProcessConfig struct {
	// Bin and Args are the program and its arguments.
	Bin  string
	Args []string
	// Env is added to the harness's own environment.
	Env []string
	// Cgroup, when set, is where the process runs from its first
	// instruction: a shell writes its own PID into the cgroup's procs files,
	// then execs the program with the same PID.
	Cgroup *Cgroup
	// Controllers, when set, limits the placement to these controllers of
	// Cgroup (see Cgroup.ProcsFilesOf); default: all of them.
	Controllers []string
	// LogPath receives stdout and stderr of every incarnation (appended).
	LogPath string
	// Restart restarts the process after RestartDelay when it dies, as a
	// kubelet would (with a short fixed delay instead of the kubelet's
	// growing back-off, so that a one-minute run sees the crash loop).
	Restart      bool
	RestartDelay time.Duration
	// Logf reports deaths and restarts; nil: silent.
	Logf func(format string, args ...any)
}

// Process is a running program supervised by the harness.
type Process struct {
	cfg ProcessConfig

	mu       sync.Mutex
	pid      int
	alive    bool
	restarts int
	exits    []string
	stopping bool
	stopCh   chan struct{}
	done     chan struct{}
}

// StartProcess starts the first incarnation and the supervisor.
func StartProcess(cfg ProcessConfig) (*Process, error) {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	p := &Process{cfg: cfg, stopCh: make(chan struct{}), done: make(chan struct{})}
	cmd, err := p.spawn()
	if err != nil {
		return nil, err
	}
	go p.supervise(cmd)
	return p, nil
}

func (p *Process) spawn() (*exec.Cmd, error) {
	logf, err := os.OpenFile(p.cfg.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "=== harness: starting %s at %s\n", p.cfg.Bin, time.Now().UTC().Format(time.RFC3339Nano))
	var cmd *exec.Cmd
	env := append(os.Environ(), p.cfg.Env...)
	if p.cfg.Cgroup != nil {
		procs := p.cfg.Cgroup.ProcsFiles()
		if len(p.cfg.Controllers) > 0 {
			if procs, err = p.cfg.Cgroup.ProcsFilesOf(p.cfg.Controllers...); err != nil {
				return nil, err
			}
		}
		script := `for f in $HARNESS_CGROUP_PROCS; do echo $$ > "$f" || exit 97; done; exec "$@"`
		cmd = exec.Command("/bin/sh", append([]string{"-c", script, "sh", p.cfg.Bin}, p.cfg.Args...)...)
		env = append(env, "HARNESS_CGROUP_PROCS="+strings.Join(procs, " "))
	} else {
		cmd = exec.Command(p.cfg.Bin, p.cfg.Args...)
	}
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logf, logf
	// Own process group: a Ctrl-C on the terminal reaches the harness only,
	// which then stops the process itself.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.pid, p.alive = cmd.Process.Pid, true
	p.mu.Unlock()
	return cmd, nil
}

func (p *Process) supervise(cmd *exec.Cmd) {
	defer close(p.done)
	for {
		err := cmd.Wait()
		p.mu.Lock()
		p.alive = false
		stopping := p.stopping
		desc := "exited"
		if err != nil {
			desc = err.Error()
		}
		p.exits = append(p.exits, fmt.Sprintf("%s pid %d: %s", time.Now().UTC().Format("15:04:05.000"), p.pid, desc))
		p.mu.Unlock()
		if stopping || !p.cfg.Restart {
			if !stopping {
				p.cfg.Logf("%s pid %d died (%s)", p.cfg.Bin, cmd.Process.Pid, desc)
			}
			return
		}
		p.cfg.Logf("%s pid %d died (%s); restarting in %s", p.cfg.Bin, cmd.Process.Pid, desc, p.cfg.RestartDelay)
		select {
		case <-p.stopCh:
			return
		case <-time.After(p.cfg.RestartDelay):
		}
		p.mu.Lock()
		if p.stopping {
			p.mu.Unlock()
			return
		}
		p.restarts++
		p.mu.Unlock()
		next, err := p.spawn()
		if err != nil {
			p.cfg.Logf("restarting %s: %v", p.cfg.Bin, err)
			return
		}
		cmd = next
	}
}

// State returns the current PID, whether it runs, and the restarts so far.
func (p *Process) State() (pid int, alive bool, restarts int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pid, p.alive, p.restarts
}

// Done is closed once the process has exited for good (not to be
// restarted).
func (p *Process) Done() <-chan struct{} { return p.done }

// Exits lists every death so far, one line each.
func (p *Process) Exits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.exits...)
}

// Stop ends the process: SIGTERM to its PID, SIGKILL after grace.
func (p *Process) Stop(grace time.Duration) { p.Terminate(grace) }

// Terminate ends the process as Stop does and tells how long it took to
// exit after the SIGTERM and whether it had to be killed: how long its
// graceful shutdown lasts is what a benchmark of shutdown measures. A
// process already stopping or not running took 0.
func (p *Process) Terminate(grace time.Duration) (took time.Duration, killed bool) {
	p.mu.Lock()
	if p.stopping {
		p.mu.Unlock()
		<-p.done
		return 0, false
	}
	p.stopping = true
	close(p.stopCh)
	pid, alive := p.pid, p.alive
	p.mu.Unlock()
	if alive {
		start := time.Now()
		_ = syscall.Kill(pid, syscall.SIGTERM)
		select {
		case <-p.done:
			return time.Since(start), false
		case <-time.After(grace):
			p.cfg.Logf("%s pid %d did not stop in %s: SIGKILL", p.cfg.Bin, pid, grace)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		<-p.done
		return time.Since(start), true
	}
	<-p.done
	return 0, false
}

// WaitReady waits until url answers 200.
func WaitReady(ctx context.Context, url string, timeout time.Duration) error {
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
			return errors.Join(fmt.Errorf("not ready at %s", url), err, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}
