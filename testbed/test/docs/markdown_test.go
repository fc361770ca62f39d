// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// repoFile reads a file of the repository by its path from the root (this
// package is testbed/test/docs).
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "..", filepath.FromSlash(rel)))
	require.NoError(t, err)
	return string(b)
}

// taggedBlocks returns the fenced yaml blocks of md that follow a comment
// <!-- NAME: TAG -->, by TAG, for one NAME ("before", "after").
func taggedBlocks(t *testing.T, md, name string) map[string]string {
	t.Helper()
	re := regexp.MustCompile("(?s)<!-- " + regexp.QuoteMeta(name) + ": ([a-z0-9-]+) -->\n```yaml\n(.*?)```")
	blocks := map[string]string{}
	for _, m := range re.FindAllStringSubmatch(md, -1) {
		_, dup := blocks[m[1]]
		require.False(t, dup, "two %q blocks tagged %q", name, m[1])
		blocks[m[1]] = m[2]
	}
	return blocks
}

// tableRows returns the body rows of the first Markdown table after the
// heading line `heading`, each as its trimmed cells.
func tableRows(t *testing.T, md, heading string) [][]string {
	t.Helper()
	i := strings.Index(md, "\n"+heading+"\n")
	require.GreaterOrEqual(t, i, 0, "no heading %q", heading)
	var rows [][]string
	inTable := false
	for line := range strings.SplitSeq(md[i+len(heading)+2:], "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			require.False(t, strings.HasPrefix(line, "#"), "no table under %q", heading)
			continue
		}
		inTable = true
		cells := splitRow(line)
		if isSeparator(cells) {
			continue
		}
		rows = append(rows, cells)
	}
	require.Greater(t, len(rows), 1, "no table under %q", heading)
	return rows[1:] // the header
}

// splitRow splits a table row on the pipes that are not escaped (\|).
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimSuffix(strings.TrimPrefix(line, "|"), "|")
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

func isSeparator(cells []string) bool {
	for _, c := range cells {
		if strings.Trim(c, "-: ") != "" {
			return false
		}
	}
	return true
}

// codeSpan returns the text of a cell that is one code span (`x`), and
// whether it is one.
func codeSpan(cell string) (string, bool) {
	if len(cell) < 2 || cell[0] != '`' || cell[len(cell)-1] != '`' || strings.Count(cell, "`") != 2 {
		return "", false
	}
	return cell[1 : len(cell)-1], true
}
