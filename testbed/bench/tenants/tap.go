// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package main

import (
	"bytes"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// tap stands between one tenant's agent and the gateway (or the proxy): an
// HTTP proxy in this process that forwards each export unchanged from the
// tenant's own loopback address (collector exporters cannot choose their
// source address) and records how it fared as the agent sees it: when it
// came, its spans, the answer's status and Retry-After, and how long the
// answer took.
type tap struct {
	tenant string
	target string // http://host:port
	tr     *http.Transport
	srv    *http.Server
	ln     net.Listener

	mu          sync.Mutex
	exports     []export
	ok, refused int
}

// export is one export an agent sent, as the tap saw it.
type export struct {
	at      time.Time
	latency time.Duration
	class   class
	status  int
	spans   int64
	bytes   int64
}

// class is how an export fared.
type class uint8

// The classes of an export's answer.
const (
	classOK          class = iota // 2xx: accepted
	class429Retry                 // 429 with Retry-After
	class429                      // 429 without
	class503Retry                 // 503 with Retry-After
	class503                      // 503 without
	classOtherStatus              // any other status (the proxy's 502, a 400, ...)
	classError                    // no answer: connection refused or reset, timeout
	numClasses
)

var classNames = [numClasses]string{"ok", "429_retry_after", "429", "503_retry_after", "503", "other_status", "error"}

func (c class) String() string { return classNames[c] }

// refused reports whether the gateway (or the proxy) answered but did not
// accept.
func (c class) refused() bool { return c != classOK }

// classify is the class of an answer: its status (0: none, err set) and
// whether it carried Retry-After.
func classify(status int, retryAfter bool, err error) class {
	switch {
	case err != nil || status == 0:
		return classError
	case status >= 200 && status < 300:
		return classOK
	case status == http.StatusTooManyRequests && retryAfter:
		return class429Retry
	case status == http.StatusTooManyRequests:
		return class429
	case status == http.StatusServiceUnavailable && retryAfter:
		return class503Retry
	case status == http.StatusServiceUnavailable:
		return class503
	}
	return classOtherStatus
}

// startTap listens on a free port of 127.0.0.1 and forwards to target
// (http://host:port) from src.
func startTap(tenant string, src netip.Addr, target string) (*tap, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(src, 0)), Timeout: 5 * time.Second}
	t := &tap{
		tenant: tenant, target: target, ln: ln,
		tr: &http.Transport{
			Proxy: nil, DialContext: d.DialContext, DisableCompression: true,
			MaxIdleConns: 256, MaxIdleConnsPerHost: 256, IdleConnTimeout: 30 * time.Second,
		},
	}
	t.srv = &http.Server{Handler: t, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = t.srv.Serve(ln) }()
	return t, nil
}

// url is where the agent sends.
func (t *tap) url() string { return "http://" + t.ln.Addr().String() }

// close stops the tap and its connections.
func (t *tap) close() {
	_ = t.srv.Close()
	t.tr.CloseIdleConnections()
}

// hopByHop are the headers a proxy does not forward (RFC 9110, 7.6.1).
var hopByHop = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

func (t *tap) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	body, err := readBody(r.Body, "")
	if err != nil {
		return // the agent went away
	}
	var spans int64
	if raw, err := readBody(bytes.NewReader(body), r.Header.Get("Content-Encoding")); err == nil {
		spans, _ = countSpans(raw)
	}
	out, _ := http.NewRequestWithContext(r.Context(), r.Method, t.target+r.URL.RequestURI(), bytes.NewReader(body)) //nolint:gosec // G704: the target is the gateway or proxy this harness started on 127.0.0.1
	for k, vs := range r.Header {
		if !hopByHop[k] {
			out.Header[k] = vs
		}
	}
	resp, err := t.tr.RoundTrip(out)
	if err != nil {
		t.record(export{at: start, latency: time.Since(start), class: classError, spans: spans, bytes: int64(len(body))})
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		if !hopByHop[k] {
			w.Header()[k] = vs
		}
	}
	w.WriteHeader(resp.StatusCode)
	answer, err := readBody(resp.Body, "")
	_, _ = w.Write(answer)
	e := export{
		at: start, latency: time.Since(start), status: resp.StatusCode,
		class: classify(resp.StatusCode, resp.Header.Get("Retry-After") != "", err), spans: spans, bytes: int64(len(body)),
	}
	t.record(e)
}

func (t *tap) record(e export) {
	t.mu.Lock()
	t.exports = append(t.exports, e)
	if e.class.refused() {
		t.refused++
	} else {
		t.ok++
	}
	t.mu.Unlock()
}

// snapshot returns the exports so far.
func (t *tap) snapshot() []export {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]export(nil), t.exports...)
}

// counts returns the exports so far, accepted and refused.
func (t *tap) counts() (ok, refused int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ok, t.refused
}

// exportRow is an export's row of exports.csv.
func exportRow(round, tenant string, start time.Time, e export) []string {
	return []string{
		round, tenant, strconv.FormatFloat(e.at.Sub(start).Seconds(), 'f', 3, 64),
		e.class.String(), strconv.Itoa(e.status), strconv.FormatInt(e.spans, 10), strconv.FormatInt(e.bytes, 10),
		strconv.FormatFloat(float64(e.latency.Microseconds())/1000, 'f', 3, 64),
	}
}

var exportsHeader = []string{"round", "tenant", "t_s", "class", "status", "spans", "bytes", "latency_ms"}
