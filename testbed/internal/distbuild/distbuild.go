// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package distbuild builds this repository's collector distributions with
// ocb, cached by a hash of what each is built from under the user's cache
// folder: otelcol-throttle (builder-config.yaml, from this checkout) and the
// fleet benchmark's peers otelcol-stock and otelcol-mlext
// (testbed/bench/fleet). It is the one builder: the tests take their
// binaries from it (Binary, Stock), and make copies its builds into _build/
// (testbed/cmd/distbuild).
//
// Set OTELCOL_THROTTLE_BINARY or OTELCOL_STOCK_BINARY to have the tests use
// a binary built elsewhere.
package distbuild // import "github.com/otelthrottle/throttle/testbed/internal/distbuild"

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/otelthrottle/throttle/internal/testutil/e2eskip"
)

const (
	// keepBuilds is how many cached otelcol-throttle builds (one per source
	// hash) are kept; older ones are removed after a build.
	keepBuilds = 3
	// buildTimeout bounds ocb (module download + compile). A cold build of
	// this distribution takes about 2.5 minutes on 2 cores.
	buildTimeout = 15 * time.Minute
)

// distribution is one ocb manifest of this repository.
type distribution struct {
	// name is the binary's name, the manifest's dist.name.
	name string
	// manifest is the manifest's path from the repository root.
	manifest string
	// ocb is the release of ocb (go.opentelemetry.io/collector/cmd/builder)
	// that builds it: the release of its collector modules.
	ocb string
	// fromCheckout: built from this checkout (the manifest's replace of the
	// throttle module points at it, and the cache key covers its sources);
	// otherwise the cache key is the manifest alone.
	fromCheckout bool
}

var (
	throttle = distribution{name: "otelcol-throttle", manifest: "builder-config.yaml", ocb: "v0.165.0", fromCheckout: true}
	// stock has no throttle code: the fleet benchmark and its test run it
	// as agents, sink and stock gateways.
	stock = distribution{name: "otelcol-stock", manifest: "testbed/bench/fleet/otelcol-stock.yaml", ocb: "v0.165.0"}
	// mlext is a stock collector with core's memory_limiter extension, at
	// the last release that serves it (the manifest says why).
	mlext = distribution{name: "otelcol-mlext", manifest: "testbed/bench/fleet/otelcol-mlext.yaml", ocb: "v0.159.0"}
)

// Names are the distributions Build knows.
func Names() []string { return []string{throttle.name, stock.name, mlext.name} }

// Build returns the path of the named distribution (one of Names) in the
// cache, building it with ocb when the cache has none for its current
// sources, and ocb's output when it ran.
func Build(name string) (bin, log string, err error) {
	for _, d := range []distribution{throttle, stock, mlext} {
		if d.name == name {
			return d.build()
		}
	}
	return "", "", fmt.Errorf("no distribution %q (want one of %s)", name, strings.Join(Names(), ", "))
}

var (
	buildOnce sync.Once
	builtPath string
	buildErr  error
	buildLog  string
)

// Binary returns the path of the otelcol-throttle binary built from this
// checkout, building it once per test binary; it skips the test without a
// go toolchain (fails it under CI), and fails it when the build fails.
func Binary(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("OTELCOL_THROTTLE_BINARY"); p != "" {
		return p
	}
	skipUnlessBuildable(tb)
	buildOnce.Do(func() {
		start := time.Now()
		builtPath, buildLog, buildErr = throttle.build()
		if buildErr == nil {
			tb.Logf("distribution: %s (ready in %s)", builtPath, time.Since(start).Round(time.Millisecond))
		}
	})
	if buildErr != nil {
		tb.Fatalf("building the distribution: %v\n%s", buildErr, tail(buildLog, 60))
	}
	return builtPath
}

var (
	stockOnce sync.Once
	stockPath string
	stockErr  error
	stockLog  string
)

// Stock returns the path of the otelcol-stock binary, building it once per
// test binary; like Binary, it skips without a go toolchain.
func Stock(tb testing.TB) string {
	tb.Helper()
	if p := os.Getenv("OTELCOL_STOCK_BINARY"); p != "" {
		return p
	}
	skipUnlessBuildable(tb)
	stockOnce.Do(func() { stockPath, stockLog, stockErr = stock.build() })
	if stockErr != nil {
		tb.Fatalf("building otelcol-stock: %v\n%s", stockErr, tail(stockLog, 60))
	}
	return stockPath
}

func skipUnlessBuildable(tb testing.TB) {
	tb.Helper()
	if _, err := exec.LookPath("go"); err != nil {
		e2eskip.Missing(tb, "no go toolchain on PATH: cannot build a distribution with ocb")
	}
}

// repoRoot is the root of the throttle module: the nearest folder at or
// above the working directory whose go.mod declares it.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && bytes.Contains(b, []byte("module github.com/otelthrottle/throttle\n")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod of github.com/otelthrottle/throttle at or above the working directory")
		}
		dir = parent
	}
}

// cacheRoot is where built distributions and ocb are kept across runs:
// $XDG_CACHE_HOME/otelcol-throttle or ~/.cache/otelcol-throttle (the OS's
// user cache folder), or a folder under the temp dir when there is none.
func cacheRoot() string {
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "otelcol-throttle")
	}
	return filepath.Join(os.TempDir(), "otelcol-throttle-cache")
}

// sourceHash hashes everything otelcol-throttle is built from: the ocb
// manifest, go.mod, go.sum and every non-test Go file of the module
// (testdata and nested modules such as testbed excluded), plus the go and
// ocb versions and the target platform.
func sourceHash(root, ocbVersion string) (string, error) {
	files := []string{"builder-config.yaml", "go.mod", "go.sum"}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel == "." {
				return nil
			}
			name := d.Name()
			if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || name == "testdata" || name == "bin" {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // another module (internal/tools, testbed)
			}
			return nil
		}
		if strings.HasSuffix(rel, ".go") && !strings.HasSuffix(rel, "_test.go") {
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	slices.Sort(files[3:])
	h, err := toolchainHash(ocbVersion)
	if err != nil {
		return "", err
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			return "", err
		}
		fmt.Fprintf(h, "%s\x00%d\x00", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:24], nil
}

// build returns the cached binary for the distribution's current sources
// or builds it with ocb into the cache.
func (d distribution) build() (bin, log string, err error) {
	root, err := repoRoot()
	if err != nil {
		return "", "", err
	}
	cache := cacheRoot()
	if d.fromCheckout {
		hash, err := sourceHash(root, d.ocb)
		if err != nil {
			return "", "", fmt.Errorf("hashing the sources: %w", err)
		}
		return ocbBuild{
			final:    filepath.Join(cache, hash, d.name),
			binary:   d.name,
			manifest: filepath.Base(d.manifest),
			ocb:      d.ocb,
			dir:      root,
			render:   func(work string) ([]byte, error) { return rewriteManifest(root, d.manifest, work) },
			done:     func() { pruneCache(cache, hash) },
		}.run(cache)
	}
	manifest, err := os.ReadFile(filepath.Join(root, d.manifest))
	if err != nil {
		return "", "", err
	}
	if n := len(outputPathRE.FindAll(manifest, -1)); n != 1 {
		return "", "", fmt.Errorf("%s: want one dist.output_path line, found %d", d.manifest, n)
	}
	h, err := toolchainHash(d.ocb)
	if err != nil {
		return "", "", err
	}
	h.Write(manifest)
	// The cache folder is named by the binary's name less "otelcol-".
	prefix := strings.TrimPrefix(d.name, "otelcol-")
	return ocbBuild{
		final:    filepath.Join(cache, prefix+"-"+hex.EncodeToString(h.Sum(nil))[:24], d.name),
		binary:   d.name,
		manifest: filepath.Base(d.manifest),
		ocb:      d.ocb,
		render: func(work string) ([]byte, error) {
			return outputPathRE.ReplaceAll(manifest, []byte("${1} "+quote(work))), nil
		},
	}.run(cache)
}

// toolchainHash starts a hash of what a build depends on besides its
// sources: the ocb and go versions and the target platform.
func toolchainHash(ocbVersion string) (hash.Hash, error) {
	goVersion, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return nil, fmt.Errorf("go env GOVERSION: %w", err)
	}
	h := sha256.New()
	fmt.Fprintf(h, "ocb %s\ngo %s\n%s/%s\n", ocbVersion, bytes.TrimSpace(goVersion), runtime.GOOS, runtime.GOARCH)
	return h, nil
}

// ocbBuild is one distribution built with ocb into the cache. Builds go to a
// fresh folder and the binary is renamed into place, so concurrent test
// runs never see half a binary.
type ocbBuild struct {
	// final is the cached binary's path; binary its name in ocb's output
	// folder; manifest the manifest's file name; ocb the release of ocb;
	// dir ocb's working directory ("" for the build folder).
	final, binary, manifest, ocb, dir string
	// render returns the manifest with its output folder set to work.
	render func(work string) ([]byte, error)
	// done, if set, runs once the binary is in place.
	done func()
}

// run returns the cached binary, or builds it.
func (b ocbBuild) run(cache string) (bin, log string, err error) {
	if fi, err := os.Stat(b.final); err == nil && fi.Mode().IsRegular() {
		now := time.Now()
		_ = os.Chtimes(filepath.Dir(b.final), now, now) // most recently used, for pruning
		return b.final, "", nil
	}
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), buildTimeout)
	defer cancel()
	var out bytes.Buffer
	ocb, err := installOCB(ctx, cache, b.ocb, &out)
	if err != nil {
		return "", out.String(), fmt.Errorf("installing ocb %s: %w", b.ocb, err)
	}
	work, err := os.MkdirTemp(cache, "build-")
	if err != nil {
		return "", "", err
	}
	defer os.RemoveAll(work)
	manifest, err := b.render(work)
	if err != nil {
		return "", "", err
	}
	manifestPath := filepath.Join(work, b.manifest)
	if err := os.WriteFile(manifestPath, manifest, 0o600); err != nil {
		return "", "", err
	}
	cmd := exec.CommandContext(ctx, ocb, "--config", manifestPath)
	cmd.Dir = cmp.Or(b.dir, work)
	cmd.Env = append(os.Environ(), "GOWORK=off")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", out.String(), fmt.Errorf("%s --config %s: %w", ocb, manifestPath, err)
	}
	if err := os.MkdirAll(filepath.Dir(b.final), 0o755); err != nil {
		return "", out.String(), err
	}
	if err := os.Rename(filepath.Join(work, b.binary), b.final); err != nil {
		return "", out.String(), err
	}
	if b.done != nil {
		b.done()
	}
	return b.final, out.String(), nil
}

var (
	outputPathRE = regexp.MustCompile(`(?m)^(\s*output_path:).*$`)
	replaceRE    = regexp.MustCompile(`(?m)^(\s*-\s*github\.com/otelthrottle/throttle\s*=>).*$`)
)

// rewriteManifest returns the repository's manifest (builder-config.yaml)
// with the output folder set to work and the replace of the throttle module
// pointing at root by absolute path (the committed one is relative to
// ./_build). Everything else, the list of components and their versions
// included, is the file users copy, unchanged.
func rewriteManifest(root, manifest, work string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(root, manifest))
	if err != nil {
		return nil, err
	}
	if n := len(outputPathRE.FindAll(b, -1)); n != 1 {
		return nil, fmt.Errorf("%s: want one dist.output_path line, found %d", manifest, n)
	}
	if n := len(replaceRE.FindAll(b, -1)); n != 1 {
		return nil, fmt.Errorf("%s: want one `- github.com/otelthrottle/throttle => ...` replace, found %d", manifest, n)
	}
	b = outputPathRE.ReplaceAll(b, []byte("${1} "+quote(work)))
	b = replaceRE.ReplaceAll(b, []byte("${1} "+filepath.ToSlash(root)))
	return b, nil
}

func quote(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }

// installOCB returns ocb at ocbVersion, installing it into the cache with
// `go install` when it is not there yet.
func installOCB(ctx context.Context, cache, ocbVersion string, out io.Writer) (string, error) {
	dir := filepath.Join(cache, "tools")
	path := filepath.Join(dir, "ocb-"+ocbVersion)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	gobin, err := os.MkdirTemp(cache, "ocb-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(gobin)
	cmd := exec.CommandContext(ctx, "go", "install", "go.opentelemetry.io/collector/cmd/builder@"+ocbVersion)
	cmd.Dir = gobin // outside any module
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOWORK=off", "GOFLAGS=")
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Run(); err != nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(gobin, "builder"), path); err != nil {
		return "", err
	}
	return path, nil
}

// pruneCache removes all but the keepBuilds most recently used builds
// (folders named by a source hash) and stale build folders of runs that
// died. Only names this package creates are touched.
func pruneCache(cache, current string) {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	type build struct {
		name string
		mod  time.Time
	}
	var builds []build
	hashRE := regexp.MustCompile(`^[0-9a-f]{24}$`)
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		switch {
		case hashRE.MatchString(e.Name()) && e.Name() != current:
			builds = append(builds, build{e.Name(), info.ModTime()})
		case (strings.HasPrefix(e.Name(), "build-") || strings.HasPrefix(e.Name(), "ocb-")) && time.Since(info.ModTime()) > 2*buildTimeout:
			_ = os.RemoveAll(filepath.Join(cache, e.Name()))
		}
	}
	slices.SortFunc(builds, func(a, b build) int { return b.mod.Compare(a.mod) })
	for i, b := range builds {
		if i >= keepBuilds-1 {
			_ = os.RemoveAll(filepath.Join(cache, b.name))
		}
	}
}

func tail(s string, lines int) string {
	parts := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(parts) > lines {
		parts = parts[len(parts)-lines:]
	}
	return strings.Join(parts, "\n")
}

// RepoRoot returns the root of the throttle module (the nearest folder at or
// above the working directory whose go.mod declares it).
func RepoRoot() (string, error) { return repoRoot() }

// Tail returns the last lines of s, for failure messages.
func Tail(s string, lines int) string { return tail(s, lines) }
