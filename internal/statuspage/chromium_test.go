// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

//go:build linux && e2e

package statuspage

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"html"
	"image"
	"image/color"
	"image/png"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/otelthrottle/throttle/internal/testutil/e2eskip"
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
	e2eskip.Missing(t, "no chromium binary on PATH for the status page's browser test (set THROTTLE_CHROMIUM, or install it: %s)", chromiumInstall)
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
// on a loopback port chosen by the kernel, with info; it returns the URL
// and the live status served.
func serveBurst(t *testing.T, info func() Info) (string, LiveStatus) {
	t.Helper()
	ring, live := burst(time.Now(), 250*time.Millisecond)
	live.Stale = false
	live.Keys = []KeyStatus{{Name: "tenant-<a>", Reserved: 2 << 20, Held: 1, Admitted: 40, Refused: 3}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	h := Handler(ring, info, func() LiveStatus { return live }, ln.Addr().String())
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
	return "http://" + ln.Addr().String() + "/", live
}

// renderDOM loads url in headless Chromium and returns the DOM once the page
// has run, without its script (assert on the rendered markup, not on the
// script's string literals).
func renderDOM(t *testing.T, bin, url string) string {
	t.Helper()
	dom := string(runChromium(t, bin, "--virtual-time-budget=5000", "--dump-dom", url))
	return regexp.MustCompile(`(?s)<script>.*?</script>`).ReplaceAllString(dom, "")
}

// element returns the markup of the element with the given id (the first
// closing tag of its name ends it: for elements without nested ones of the
// same name), or "".
func element(dom, tag, id string) string {
	return regexp.MustCompile(`(?s)<` + tag + `[^>]*\sid="` + id + `"[^>]*>.*?</` + tag + `>`).FindString(dom)
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
	url, live := serveBurst(t, testInfo)

	t.Run("dom", func(t *testing.T) {
		dom := renderDOM(t, bin, url)
		require.Contains(t, dom, `data-rendered="`, "page did not run its script")
		rendered := regexp.MustCompile(`<body[^>]*data-rendered="(\d+)"`).FindStringSubmatch(dom)
		require.NotNil(t, rendered, "no render counter on body")
		n, _ := strconv.Atoi(rendered[1])
		assert.GreaterOrEqual(t, n, 2, "page rendered only before its first fetch")

		panels := map[string]int{}
		for _, tag := range sectionRE.FindAllString(dom, -1) {
			if attr(tag, "data-panel") == "" {
				continue // not a chart: the clients' table
			}
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

		// The clients' table shows the live keys, the header value as text.
		assert.Regexp(t, `<td>tenant-&lt;a&gt;</td><td>[^<]+</td><td>1</td><td>40</td><td>3</td>`, element(dom, "tbody", "keys"))

		// Enforcing: no observe_only banner, denials are denials.
		assert.Regexp(t, `<div class="banner" id="observe" hidden`, dom)
		assert.Contains(t, dom, `data-observe-only="0"`)
		assert.Contains(t, element(dom, "span", "denied-label"), ">denied<")

		// The state changes, newest first, as the server listed them.
		require.NotEmpty(t, live.Transitions, "the fixture changes state")
		rows := regexp.MustCompile(`(?s)<tr data-from="(\w+)" data-to="(\w+)">(.*?)</tr>`).FindAllStringSubmatch(element(dom, "tbody", "transitions"), -1)
		require.Len(t, rows, len(live.Transitions))
		for i, tr := range live.Transitions {
			assert.Equal(t, tr.From.String(), rows[i][1], i)
			assert.Equal(t, tr.To.String(), rows[i][2], i)
			assert.Contains(t, rows[i][3], ">"+html.EscapeString(tr.Why)+"<", i)
			assert.Contains(t, rows[i][3], ">all signals<", i)
			assert.Contains(t, rows[i][3], ">"+tr.At.Local().Format("15:04:05")+"<", i)
		}
		assert.Regexp(t, `<div class="empty" id="no-transitions" hidden`, dom)

		// The Go runtime's settings, and the configuration as a YAML-like tree.
		assert.Contains(t, element(dom, "div", "v-go"), ">410 MiB<")
		assert.Contains(t, element(dom, "div", "s-go"), ">GOGC 100 · owned by throttle<")
		cfg := element(dom, "pre", "config-text")
		for _, line := range []string{
			"check_interval: 250ms",
			"cpu:\n  enabled: true\n  enter: 0.9\n  exit: 0.8\n  hard: 1.1\n  max_shed: 0.2\n",
			"memory:\n  enabled: true\n  enter: 0.85\n  exit: 0.78\n  hard: 0.92\n  soft_limit:\n    enabled: true\n",
			"routes:\n  grpc: null\n  http: {}\n",
			"    allowed_origins:\n      - https://a.example\n      - https://b.example\n",
			`note: "a: b"`,
		} {
			assert.Contains(t, cfg, line)
		}
	})

	t.Run("observe_only", func(t *testing.T) {
		url, _ := serveBurst(t, func() Info {
			in := testInfo()
			in.ObserveOnly = true
			return in
		})
		dom := renderDOM(t, bin, url)
		banner := element(dom, "div", "observe")
		require.NotEmpty(t, banner)
		assert.NotContains(t, banner, "hidden")
		assert.Contains(t, banner, "nothing is refused")
		assert.Contains(t, dom, `data-observe-only="1"`)
		assert.Contains(t, element(dom, "span", "denied-label"), ">would deny<")
	})

	// docs/status-page.png is this screenshot: make status-page-png.
	t.Run("screenshot", func(t *testing.T) {
		// A fresh fixture, so that the charts end at the page's now.
		url, _ := serveBurst(t, testInfo)
		out := filepath.Join(t.TempDir(), "status.png")
		runChromium(t, bin, "--virtual-time-budget=5000", "--window-size=1280,980", "--screenshot="+out, url)
		shot, err := os.ReadFile(out)
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(shot, []byte("\x89PNG\r\n\x1a\n")), "not a PNG")
		// A blank 1280x980 page compresses to a few KB; charts and text do not.
		assert.Greater(t, len(shot), 40<<10, "screenshot is suspiciously small")
		if dst := os.Getenv("THROTTLE_WRITE_SCREENSHOT"); dst != "" {
			small, err := paletted(shot)
			require.NoError(t, err)
			require.Less(t, len(small), 150<<10, "a tracked image stays under 150 KB")
			require.NoError(t, os.MkdirAll(filepath.Dir(dst), 0o755))
			require.NoError(t, os.WriteFile(dst, small, 0o644))
			t.Logf("wrote %s (%d bytes)", dst, len(small))
		}
	})
}

// paletted re-encodes a screenshot with the 256 colours it uses most, each
// pixel as the nearest of them: flat panels and text stay exact, and the
// file is a fraction of the size of Chromium's RGBA one.
func paletted(b []byte) ([]byte, error) {
	img, err := png.Decode(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	r := img.Bounds()
	counts := map[color.RGBA]int{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			counts[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	byUse := slices.SortedFunc(maps.Keys(counts), func(a, b color.RGBA) int {
		if d := counts[b] - counts[a]; d != 0 {
			return d
		}
		return cmp.Compare(uint32(a.R)<<24|uint32(a.G)<<16|uint32(a.B)<<8|uint32(a.A),
			uint32(b.R)<<24|uint32(b.G)<<16|uint32(b.B)<<8|uint32(b.A))
	})
	pal := make(color.Palette, 0, 256)
	for _, c := range byUse[:min(256, len(byUse))] {
		pal = append(pal, c)
	}
	out := image.NewPaletted(r, pal)
	index := map[color.RGBA]uint8{}
	for y := r.Min.Y; y < r.Max.Y; y++ {
		for x := r.Min.X; x < r.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := index[c]
			if !ok {
				i = uint8(pal.Index(c))
				index[c] = i
			}
			out.SetColorIndex(x, y, i)
		}
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&buf, out); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
