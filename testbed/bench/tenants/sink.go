// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// sink is where the gateway's otlp_http exporter delivers: an OTLP/HTTP
// server in this process that answers every export with success and counts
// its spans per tenant, decoding no more of the protobuf than it takes to
// find each resource's tenant attribute and count its spans (a stock
// collector as sink would decode everything on the cores the agents
// need, and could not tell the tenants apart).
type sink struct {
	srv *http.Server
	ln  net.Listener
	// counts holds a counter per known tenant; the others, and spans
	// without the attribute, count as otherTenant.
	counts map[string]*atomic.Int64
	// bad counts the exports it could not decode.
	bad atomic.Int64
}

// otherTenant counts the spans of no known tenant.
const otherTenant = "other"

// startSink listens on a free port of 127.0.0.1 and counts the spans of
// tenants.
func startSink(tenants []string) (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{ln: ln, counts: map[string]*atomic.Int64{otherTenant: {}}}
	for _, t := range tenants {
		s.counts[t] = &atomic.Int64{}
	}
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(ln) }()
	return s, nil
}

// port is the sink's port on 127.0.0.1.
func (s *sink) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

// close stops the sink.
func (s *sink) close() { _ = s.srv.Close() }

var gzipReaders sync.Pool

func (s *sink) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := readBody(r.Body, r.Header.Get("Content-Encoding"))
	if err == nil {
		err = walkTraces(body, tenantAttr, s.add)
	}
	if err != nil {
		s.bad.Add(1)
	}
	// An empty ExportTraceServiceResponse: full success.
	w.Header().Set("Content-Type", "application/x-protobuf")
	w.WriteHeader(http.StatusOK)
}

func (s *sink) add(tenant string, spans int64) {
	c, ok := s.counts[tenant]
	if !ok {
		c = s.counts[otherTenant]
	}
	c.Add(spans)
}

// snapshot returns the spans counted so far per tenant.
func (s *sink) snapshot() map[string]int64 {
	out := make(map[string]int64, len(s.counts))
	for t, c := range s.counts {
		out[t] = c.Load()
	}
	return out
}

// readBody reads an OTLP/HTTP body, gunzipped when its encoding is gzip.
func readBody(body io.Reader, encoding string) ([]byte, error) {
	switch encoding {
	case "", "identity":
		return io.ReadAll(body)
	case "gzip":
		zr, _ := gzipReaders.Get().(*gzip.Reader)
		var err error
		if zr == nil {
			zr, err = gzip.NewReader(body)
		} else {
			err = zr.Reset(body)
		}
		if err != nil {
			return nil, err
		}
		defer gzipReaders.Put(zr)
		return io.ReadAll(zr)
	}
	return nil, fmt.Errorf("content encoding %q", encoding)
}

// The field numbers walkTraces reads, from opentelemetry-proto.
const (
	fieldResourceSpans = 1 // ExportTraceServiceRequest.resource_spans
	fieldResource      = 1 // ResourceSpans.resource
	fieldScopeSpans    = 2 // ResourceSpans.scope_spans
	fieldAttributes    = 1 // Resource.attributes
	fieldKey           = 1 // KeyValue.key
	fieldValue         = 2 // KeyValue.value
	fieldStringValue   = 1 // AnyValue.string_value
	fieldSpans         = 2 // ScopeSpans.spans
)

var errProto = errors.New("malformed protobuf")

// walkTraces calls add with the value of the resource attribute attr ("" when
// it has none) and the number of spans of each ResourceSpans of an OTLP
// ExportTraceServiceRequest.
func walkTraces(b []byte, attr string, add func(tenant string, spans int64)) error {
	return eachField(b, func(num protowire.Number, v []byte) error {
		if num != fieldResourceSpans {
			return nil
		}
		var tenant string
		var spans int64
		err := eachField(v, func(num protowire.Number, v []byte) error {
			switch num {
			case fieldResource:
				t, err := resourceAttr(v, attr)
				tenant = t
				return err
			case fieldScopeSpans:
				return eachField(v, func(num protowire.Number, _ []byte) error {
					if num == fieldSpans {
						spans++
					}
					return nil
				})
			}
			return nil
		})
		if err != nil {
			return err
		}
		add(tenant, spans)
		return nil
	})
}

// countSpans is the number of spans of an OTLP ExportTraceServiceRequest.
func countSpans(b []byte) (int64, error) {
	var n int64
	err := walkTraces(b, "", func(_ string, spans int64) { n += spans })
	return n, err
}

// resourceAttr returns the string value of attribute attr of a Resource.
func resourceAttr(b []byte, attr string) (string, error) {
	var out string
	err := eachField(b, func(num protowire.Number, v []byte) error {
		if num != fieldAttributes || out != "" {
			return nil
		}
		var key, value []byte
		err := eachField(v, func(num protowire.Number, v []byte) error {
			switch num {
			case fieldKey:
				key = v
			case fieldValue:
				return eachField(v, func(num protowire.Number, v []byte) error {
					if num == fieldStringValue {
						value = v
					}
					return nil
				})
			}
			return nil
		})
		if err == nil && bytes.Equal(key, []byte(attr)) {
			out = string(value)
		}
		return err
	})
	return out, err
}

// eachField calls f with the number and the bytes of every length-delimited
// field of message b, skipping the others.
func eachField(b []byte, f func(num protowire.Number, v []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errProto
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return errProto
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errProto
		}
		b = b[n:]
		if err := f(num, v); err != nil {
			return err
		}
	}
	return nil
}
