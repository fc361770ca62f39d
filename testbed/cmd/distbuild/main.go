// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Command distbuild builds one of this repository's collector distributions
// with ocb, as the tests do (testbed/internal/distbuild: cached by a hash of
// its sources under the user's cache folder), and copies the binary to -o.
// The Makefile's otelcol, otelcol-stock and otelcol-mlext targets run it.
//
//	distbuild -o _build/otelcol-throttle otelcol-throttle
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/otelthrottle/throttle/testbed/internal/distbuild"
)

func main() {
	out := flag.String("o", "", "where to copy the binary (required)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: distbuild -o path {%s}\n", strings.Join(distbuild.Names(), "|"))
		flag.PrintDefaults()
	}
	flag.Parse()
	if *out == "" || flag.NArg() != 1 {
		flag.Usage()
		os.Exit(2)
	}
	bin, log, err := distbuild.Build(flag.Arg(0))
	if err != nil {
		fmt.Fprintf(os.Stderr, "distbuild: %v\n%s", err, distbuild.Tail(log, 60))
		os.Exit(1)
	}
	if err := install(bin, *out); err != nil {
		fmt.Fprintf(os.Stderr, "distbuild: %v\n", err)
		os.Exit(1)
	}
	fmt.Println(*out)
}

// install copies bin to dst unless dst already is that build (same size and
// modification time), through a temporary file renamed into place so that a
// running benchmark never sees half a binary. A copy, not a link: the cache
// prunes old builds.
func install(bin, dst string) error {
	src, err := os.Stat(bin)
	if err != nil {
		return err
	}
	if cur, err := os.Stat(dst); err == nil && cur.Size() == src.Size() && cur.ModTime().Equal(src.ModTime()) {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	in, err := os.Open(bin)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+"-")
	if err != nil {
		return err
	}
	_, err = io.Copy(tmp, in)
	err = errors.Join(err, tmp.Chmod(0o755), tmp.Close())
	if err == nil {
		err = os.Chtimes(tmp.Name(), src.ModTime(), src.ModTime())
	}
	if err == nil {
		err = os.Rename(tmp.Name(), dst)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}
