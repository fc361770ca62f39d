// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"io"
	"os"
	"path/filepath"
)

// WriteSummaries rewrites dir/summary.csv (header, then rows) and
// dir/summary.md (what printMD writes). The harnesses call it after every
// scenario, so that an interrupted run keeps what it measured.
func WriteSummaries(dir string, header []string, rows [][]string, printMD func(io.Writer)) error {
	if err := WriteCSV(filepath.Join(dir, "summary.csv"), header, rows); err != nil {
		return err
	}
	md, err := os.Create(filepath.Join(dir, "summary.md"))
	if err != nil {
		return err
	}
	printMD(md)
	return md.Close()
}
