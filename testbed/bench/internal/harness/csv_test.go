// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package harness

import (
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A timeline written by several goroutines has its header first and every
// row whole; what was flushed is on disk before the file is closed.
func TestCSVFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "timeline.csv")
	f, err := CreateCSV(path, []string{"who", "n"})
	require.NoError(t, err)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for n := range 100 {
				f.Write([]string{strconv.Itoa(g), strconv.Itoa(n)})
			}
		})
	}
	wg.Wait()
	require.NoError(t, f.Flush())
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	recs, err := csv.NewReader(strings.NewReader(string(b))).ReadAll()
	require.NoError(t, err)
	require.Len(t, recs, 401)
	assert.Equal(t, []string{"who", "n"}, recs[0])
	require.NoError(t, f.Close())

	require.NoError(t, WriteCSV(path, []string{"a"}, [][]string{{"1"}, {"2"}}))
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "a\n1\n2\n", string(b), "WriteCSV writes the file anew")
}
