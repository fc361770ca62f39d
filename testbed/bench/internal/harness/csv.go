// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"encoding/csv"
	"errors"
	"os"
	"sync"
)

// WriteCSV writes path anew: header, then rows.
func WriteCSV(path string, header []string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	_ = w.Write(header)
	_ = w.WriteAll(rows)
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// CSVFile is a CSV file written row by row, by any number of goroutines:
// the timelines, written while a run goes on.
type CSVFile struct {
	mu sync.Mutex
	f  *os.File
	w  *csv.Writer
}

// CreateCSV creates path and writes header to it, flushed.
func CreateCSV(path string, header []string) (*CSVFile, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	c := &CSVFile{f: f, w: csv.NewWriter(f)}
	c.Write(header)
	if err := c.Flush(); err != nil {
		f.Close()
		return nil, err
	}
	return c, nil
}

// Write writes rows; they reach the file by the next Flush (or Close).
func (c *CSVFile) Write(rows ...[]string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range rows {
		_ = c.w.Write(r)
	}
}

// Flush writes out what Write buffered, so that an interrupted run keeps
// it, and returns the first error writing met.
func (c *CSVFile) Flush() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w.Flush()
	return c.w.Error()
}

// Close flushes and closes the file.
func (c *CSVFile) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w.Flush()
	return errors.Join(c.w.Error(), c.f.Close())
}
