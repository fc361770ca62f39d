// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package cgroup // import "github.com/otelthrottle/throttle/internal/cgroup"

import (
	"errors"
	"fmt"
	"io"
	"os"
)

// maxFileSize bounds how far a read buffer grows. The largest file read here
// is a v1 memory.stat (a few KiB); anything beyond 1 MiB is not a cgroup file.
const maxFileSize = 1 << 20

// initialBufSize fits every file read per tick in one read.
const initialBufSize = 8 << 10

var errTooLarge = errors.New("file larger than 1 MiB")

// hotFile is a file read every tick. It stays open and is read with pread at
// offset 0: cgroup and proc files regenerate their content on every read from
// offset 0 (the Go runtime reads cpu.max the same way), so no open, close or
// allocation happens per tick. A failed read closes the file so the next
// read reopens it, which also recovers from a cgroup that was removed and
// recreated.
type hotFile struct {
	path string
	f    *os.File
}

// setPath points the file at p, closing the old descriptor when p differs.
func (h *hotFile) setPath(p string) {
	if h.path == p {
		return
	}
	h.close()
	h.path = p
}

func (h *hotFile) close() {
	if h.f != nil {
		_ = h.f.Close()
		h.f = nil
	}
}

// read returns the whole content of the file in *buf, growing *buf when the
// file does not fit.
func (h *hotFile) read(buf *[]byte) ([]byte, error) {
	if h.f == nil {
		f, err := os.Open(h.path)
		if err != nil {
			return nil, err
		}
		h.f = f
	}
	b, err := readAt0(h.f, buf)
	if err != nil {
		h.close()
		return nil, fmt.Errorf("read %s: %w", h.path, err)
	}
	return b, nil
}

// readFile reads a file read at the slow cadence (limits) into *buf. It opens
// and closes the file each time: those files are many (one per level) and
// read rarely, so keeping them open is not worth the descriptors.
func readFile(p string, buf *[]byte) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := readAt0(f, buf)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", p, err)
	}
	return b, nil
}

func readAt0(f *os.File, buf *[]byte) ([]byte, error) {
	if len(*buf) == 0 {
		*buf = make([]byte, initialBufSize)
	}
	for {
		b := *buf
		n, err := f.ReadAt(b, 0)
		switch {
		case errors.Is(err, io.EOF) || (err == nil && n < len(b)):
			return b[:n], nil
		case err != nil:
			return nil, err
		}
		// The buffer is full: the file may be longer. Grow and read again
		// from the start, since the content is a snapshot per read.
		if len(b) >= maxFileSize {
			return nil, errTooLarge
		}
		*buf = make([]byte, 2*len(b))
	}
}
