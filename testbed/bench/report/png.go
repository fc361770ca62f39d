// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package report

import (
	"bytes"
	"cmp"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"slices"

	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// MaxChartBytes is the largest chart PNG a baseline in bench/results keeps
// (bench/results/README.md); the charts are written to stay under it.
const MaxChartBytes = 150_000

// chartColors is the size of a chart's palette. A chart is a white page
// with a dozen line colours and their anti-aliased edges: 32 colours draw
// it as it looks in full colour, at a third of the bytes of an RGB image,
// without dithering (which would add noise for the compressor to store).
const chartColors = 32

// writeChart draws a chart of chartW x chartH on a white page and writes it
// to path as a paletted PNG.
func writeChart(path string, drawOn func(draw.Canvas)) error {
	return writeChartSized(path, chartW, chartH, drawOn)
}

// writeChartSized is writeChart for a chart of w x h.
func writeChartSized(path string, w, h vg.Length, drawOn func(draw.Canvas)) error {
	img := vgimg.NewWith(vgimg.UseWH(w, h), vgimg.UseDPI(dpi))
	dc := draw.New(img)
	dc.SetColor(color.White)
	dc.Fill(dc.Path())
	drawOn(dc)
	b, err := encodeChart(img.Image())
	if err != nil {
		return err
	}
	if len(b) > MaxChartBytes {
		// Not an error: the run's figures matter more than the chart's
		// size, and promotion refuses a chart this large.
		fmt.Fprintf(os.Stderr, "report: %s is %d bytes, more than a baseline keeps (%d)\n", path, len(b), MaxChartBytes)
	}
	return os.WriteFile(path, b, 0o644)
}

// encodeChart encodes img as a paletted PNG of at most chartColors colours:
// the most frequent colours of the image, every pixel mapped to the
// nearest of them.
func encodeChart(img image.Image) ([]byte, error) {
	b := img.Bounds()
	at := func(x, y int) color.RGBA { return rgba(img.At(x, y)) }
	if m, ok := img.(*image.RGBA); ok { // what vgimg draws on: no interface call per pixel
		at = func(x, y int) color.RGBA {
			i := m.PixOffset(x, y)
			return color.RGBA{m.Pix[i], m.Pix[i+1], m.Pix[i+2], m.Pix[i+3]}
		}
	}
	// A chart is long runs of one colour (the page, the grid): counted a
	// run at a time.
	counts := map[color.RGBA]int{}
	for y := b.Min.Y; y < b.Max.Y; y++ {
		run, prev := 0, at(b.Min.X, y)
		for x := b.Min.X; x < b.Max.X; x++ {
			if c := at(x, y); c != prev {
				counts[prev] += run
				run, prev = 0, c
			}
			run++
		}
		counts[prev] += run
	}
	type colorCount struct {
		c color.RGBA
		n int
	}
	all := make([]colorCount, 0, len(counts))
	for c, n := range counts {
		all = append(all, colorCount{c, n})
	}
	// Most frequent first; ties in a fixed order, so that a chart is the
	// same bytes from the same data.
	slices.SortFunc(all, func(a, b colorCount) int {
		if a.n != b.n {
			return cmp.Compare(b.n, a.n)
		}
		return cmp.Compare(packRGBA(a.c), packRGBA(b.c))
	})
	pal := make(color.Palette, 0, chartColors)
	for _, cc := range all[:min(len(all), chartColors)] {
		pal = append(pal, cc.c)
	}
	index := make(map[color.RGBA]uint8, len(counts))
	for c := range counts {
		index[c] = uint8(pal.Index(c)) //nolint:gosec // G115: an index into chartColors (32) entries
	}
	out := image.NewPaletted(b, pal)
	for y := b.Min.Y; y < b.Max.Y; y++ {
		prev := at(b.Min.X, y)
		i := index[prev]
		for x := b.Min.X; x < b.Max.X; x++ {
			if c := at(x, y); c != prev {
				prev, i = c, index[c]
			}
			out.Pix[out.PixOffset(x, y)] = i
		}
	}
	var buf bytes.Buffer
	enc := png.Encoder{CompressionLevel: png.BestCompression}
	if err := enc.Encode(&buf, out); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func rgba(c color.Color) color.RGBA {
	return color.RGBAModel.Convert(c).(color.RGBA)
}

func packRGBA(c color.RGBA) uint32 {
	return uint32(c.R)<<24 | uint32(c.G)<<16 | uint32(c.B)<<8 | uint32(c.A)
}
