// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux

package statuspage

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// chromiumInstall is what CI runs when the browser is missing (Debian).
const chromiumInstall = "apt-get update && apt-get install -y --no-install-recommends chromium fonts-dejavu-core"

// findChromium returns the browser binary: $THROTTLE_CHROMIUM, else the first
// of the usual names on PATH. Without one the test is skipped locally and
// fails in CI (CI set), where .ci/run installs it.
func findChromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("THROTTLE_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatalf("no chromium binary on PATH and CI is set; install it with: %s", chromiumInstall)
	}
	t.Skipf("no chromium binary on PATH (set THROTTLE_CHROMIUM, or install it: %s); skipping the browser test", chromiumInstall)
	return ""
}

// runChromium runs one headless invocation in its own process group, bounded
// by 60 s, and kills whatever is left of that group afterwards (renderer and
// zygote children outlive a killed parent otherwise).
func runChromium(t *testing.T, bin string, args ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	base := []string{
		"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--disable-dev-shm-usage", "--hide-scrollbars",
		"--user-data-dir=" + t.TempDir(),
	}
	cmd := exec.CommandContext(ctx, bin, append(base, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	require.NoError(t, ctx.Err(), "chromium timed out; stderr:\n%s", stderr.String())
	var exitErr *exec.ExitError
	if errors.As(err, &exitErr) {
		t.Fatalf("chromium failed: %v; stderr:\n%s", err, stderr.String())
	}
	require.NoError(t, err)
	return stdout.Bytes()
}

// serveBurst serves the handler over a ring holding a realistic overload,
// on a loopback port chosen by the kernel.
func serveBurst(t *testing.T) string {
	t.Helper()
	ring, live := burst(time.Now(), 250*time.Millisecond)
	live.Stale = false
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := Handler(ring, testInfo, func() LiveStatus { return live }, ln.Addr().String())
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	return "http://" + ln.Addr().String() + "/"
}

var sectionRE = regexp.MustCompile(`<section[^>]*>`)

func attr(tag, name string) string {
	m := regexp.MustCompile(`\s` + name + `="([^"]*)"`).FindStringSubmatch(tag)
	if m == nil {
		return ""
	}
	return m[1]
}

func TestPageInChromium(t *testing.T) {
	bin := findChromium(t)
	url := serveBurst(t)

	t.Run("dom", func(t *testing.T) {
		dom := string(runChromium(t, bin, "--virtual-time-budget=5000", "--dump-dom", url))
		// Assert on the rendered markup, not on the script's string literals.
		dom = regexp.MustCompile(`(?s)<script>.*?</script>`).ReplaceAllString(dom, "")
		require.Contains(t, dom, `data-rendered="`, "page did not run its script")
		rendered := regexp.MustCompile(`<body[^>]*data-rendered="(\d+)"`).FindStringSubmatch(dom)
		require.NotNil(t, rendered, "no render counter on body")
		n, _ := strconv.Atoi(rendered[1])
		assert.GreaterOrEqual(t, n, 2, "page rendered only before its first fetch")

		panels := map[string]int{}
		for _, tag := range sectionRE.FindAllString(dom, -1) {
			p, err := strconv.Atoi(attr(tag, "data-points"))
			require.NoError(t, err, tag)
			panels[attr(tag, "data-panel")] = p
		}
		require.Len(t, panels, 4, "panels: %v", panels)
		// The fixture holds 2400 samples over the 10-minute window ending
		// when the server started; the oldest slide off the axis as the
		// page's clock moves on (4 a second), so leave a slow CI machine
		// plenty of margin.
		for _, name := range []string{"cpu", "mem", "state", "rate"} {
			assert.Greater(t, panels[name], 2000, "%s panel points", name)
			assert.LessOrEqual(t, panels[name], 2400, "%s panel points", name)
		}

		// The header shows the live values of the fixture.
		assert.Contains(t, dom, "cgroup v2 /sys/fs/cgroup/kubepods/pod-1234/otelcol")
		assert.Regexp(t, `data-state="(normal|shedding|open)"`, dom)
		assert.NotContains(t, dom, "disconnected:")
		assert.NotContains(t, dom, "waiting for samples")
	})

	t.Run("screenshot", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "status.png")
		runChromium(t, bin, "--virtual-time-budget=5000", "--window-size=1280,900", "--screenshot="+out, url)
		png, err := os.ReadFile(out)
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")), "not a PNG")
		// A blank 1280x900 page compresses to a few KB; charts and text do not.
		assert.Greater(t, len(png), 40<<10, "screenshot is suspiciously small")
		if dst := os.Getenv("THROTTLE_WRITE_SCREENSHOT"); dst != "" {
			require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
			require.NoError(t, os.WriteFile(dst, png, 0o644))
			t.Logf("wrote %s (%d bytes)", dst, len(png))
		}
	})
}
