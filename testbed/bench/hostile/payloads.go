// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"compress/gzip"
	"io"

	"google.golang.org/protobuf/encoding/protowire"
)

// blobRequestPrefix returns the start of a valid OTLP
// ExportTraceServiceRequest holding one span whose last attribute, "blob",
// is a string of blobLen bytes: the request is the prefix followed by the
// blob's bytes. Written field by field so that a body of tens of MiB can
// be streamed (into gzip, or onto a connection at a set pace) without ever
// being held in memory.
func blobRequestPrefix(blobLen int) []byte {
	bytesField := func(b []byte, num protowire.Number, n int) []byte {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		return protowire.AppendVarint(b, u64(n))
	}
	// AnyValue{string_value(1): blob}
	anyLen := protowire.SizeTag(1) + protowire.SizeBytes(blobLen)
	// KeyValue{key(1): "blob", value(2): AnyValue}
	key := []byte("blob")
	kvLen := protowire.SizeTag(1) + protowire.SizeBytes(len(key)) + protowire.SizeTag(2) + protowire.SizeBytes(anyLen)
	// Span{trace_id(1), span_id(2), name(5), start(7), end(8), attributes(9)}
	var head []byte
	head = protowire.AppendBytes(protowire.AppendTag(head, 1, protowire.BytesType), []byte("hostile-trace-id")) // 16 bytes
	head = protowire.AppendBytes(protowire.AppendTag(head, 2, protowire.BytesType), []byte("span-id!"))         // 8 bytes
	head = protowire.AppendBytes(protowire.AppendTag(head, 5, protowire.BytesType), []byte("hostile"))
	head = protowire.AppendFixed64(protowire.AppendTag(head, 7, protowire.Fixed64Type), 1)
	head = protowire.AppendFixed64(protowire.AppendTag(head, 8, protowire.Fixed64Type), 2)
	spanLen := len(head) + protowire.SizeTag(9) + protowire.SizeBytes(kvLen)
	// ScopeSpans{spans(2)}, ResourceSpans{scope_spans(2)},
	// ExportTraceServiceRequest{resource_spans(1)}
	ssLen := protowire.SizeTag(2) + protowire.SizeBytes(spanLen)
	rsLen := protowire.SizeTag(2) + protowire.SizeBytes(ssLen)

	var b []byte
	b = bytesField(b, 1, rsLen)
	b = bytesField(b, 2, ssLen)
	b = bytesField(b, 2, spanLen)
	b = append(b, head...)
	b = bytesField(b, 9, kvLen)
	b = protowire.AppendBytes(protowire.AppendTag(b, 1, protowire.BytesType), key)
	b = bytesField(b, 2, anyLen)
	return bytesField(b, 1, blobLen)
}

// u64 converts a length (never negative) for protowire.
func u64(n int) uint64 {
	if n < 0 {
		return 0
	}
	return uint64(n)
}

// blobRequestLen is the size of the request of blobRequestPrefix(blobLen).
func blobRequestLen(blobLen int) int { return len(blobRequestPrefix(blobLen)) + blobLen }

// blobForSize returns the blob length that makes the request size bytes
// long (or the least above it: a varint length can grow by a byte).
func blobForSize(size int) int {
	n := max(size-len(blobRequestPrefix(size)), 0)
	for blobRequestLen(n) < size {
		n++
	}
	return n
}

// fillReader yields n copies of the byte c.
type fillReader struct {
	n int64
	c byte
}

func (r *fillReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), r.n)]
	for i := range p {
		p[i] = r.c
	}
	r.n -= int64(len(p))
	return len(p), nil
}

// gzipBlobRequest returns a gzip'd valid OTLP trace request of decoded
// bytes, almost all of them one attribute of repeated letters: a body of
// some KiB on the wire that decompresses about a thousand times larger.
func gzipBlobRequest(decoded int) ([]byte, error) {
	blob := blobForSize(decoded)
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := w.Write(blobRequestPrefix(blob)); err != nil {
		return nil, err
	}
	if _, err := io.Copy(w, &fillReader{n: int64(blob), c: 'a'}); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// trickleStream is a gzip stream cut for the fill-then-trickle peer: head
// decompresses to decoded bytes (flushed, so the gateway can read all of
// them at once) and each of pieces, sent in order after it, to one more
// byte: a client that has "made progress" every time it sends a piece.
type trickleStream struct {
	head   []byte
	pieces [][]byte
}

func buildTrickle(decoded, pieces int) (*trickleStream, error) {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := io.Copy(w, &fillReader{n: int64(decoded)}); err != nil {
		return nil, err
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	s := &trickleStream{head: bytes.Clone(buf.Bytes())}
	for range pieces {
		buf.Reset()
		if _, err := w.Write([]byte{0}); err != nil {
			return nil, err
		}
		if err := w.Flush(); err != nil {
			return nil, err
		}
		s.pieces = append(s.pieces, bytes.Clone(buf.Bytes()))
	}
	return s, nil
}

// inflatedMessage returns a valid OTLP trace request of about decoded
// bytes whose bulk is one unknown field (number 1000) of zeros: decoders
// skip it, the receiver reads and decodes it, and gzip shrinks it about a
// thousand times.
func inflatedMessage(decoded int) []byte {
	const small = 64
	msg := append(blobRequestPrefix(small), bytes.Repeat([]byte{'a'}, small)...)
	pad := max(decoded-len(msg)-protowire.SizeTag(1000)-protowire.SizeVarint(u64(decoded)), 0)
	msg = protowire.AppendTag(msg, 1000, protowire.BytesType)
	msg = protowire.AppendVarint(msg, u64(pad))
	return append(msg, make([]byte, pad)...)
}

// gzipSize is the size of b gzip'd at grpc-go's default level (what the
// gateway receives for it over gRPC).
func gzipSize(b []byte) int {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Len()
}

// laneStream is the lane-trickle body, a gzip stream of zeros cut in two:
// head decompresses to headDecoded bytes and ends with a flush, so that
// the gateway can read all of them at once; tail is the rest of the
// stream, sent a few bytes at a time, each few bytes of it decompressing
// to about a thousand times as many zeros.
type laneStream struct {
	head, tail           []byte
	headDecoded, decoded int
}

func buildLaneStream(decoded, head int) (*laneStream, error) {
	var buf bytes.Buffer
	w, _ := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if _, err := io.Copy(w, &fillReader{n: int64(head)}); err != nil {
		return nil, err
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	s := &laneStream{head: bytes.Clone(buf.Bytes()), headDecoded: head, decoded: decoded}
	buf.Reset()
	if _, err := io.Copy(w, &fillReader{n: int64(decoded - head)}); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	s.tail = bytes.Clone(buf.Bytes())
	return s, nil
}

// blobMessage returns a valid OTLP trace request of about decoded bytes,
// one span whose attribute is a string of letters: unlike the inflated
// message's unknown field, the collector keeps the attribute in memory
// until its batch is exported, and gzip still shrinks it about a thousand
// times.
func blobMessage(decoded int) []byte {
	blob := blobForSize(decoded)
	return append(blobRequestPrefix(blob), bytes.Repeat([]byte{'a'}, blob)...)
}
