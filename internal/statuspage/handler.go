// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package statuspage

import (
	_ "embed"
	"encoding/json"
	"math"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/sampler"
)

//go:embed page.html
var pageHTML []byte

// pageCSP allows nothing but the page's own inline script and style and
// fetches back to the status endpoint: the page must work air-gapped, and the
// browser enforces it.
const pageCSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; " +
	"connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// Info is the slowly changing part of the status: where resources are read
// from and the configuration. Handler calls the info func on every request.
type Info struct {
	// Source describes the resource reader (cgroup v1/v2 path or process fallback).
	Source string
	// ObserveOnly is true when nothing is refused: the denials counted are
	// the ones that would have been (the page shows a banner).
	ObserveOnly bool
	// Config is the effective configuration as a tree of maps, lists and
	// scalars keyed as the user writes it; the page renders it as is.
	Config map[string]any
	// SampleInterval is the configured sample interval.
	SampleInterval time.Duration
	// Resources are the levels the lines hold, in the order of
	// LiveStatus.Levels and Sample.Levels.
	Resources []Resource
	// Signals holds the rules, indexed by decision.Signal.
	// Enabled is false for a signal that is always admitted: its rule is
	// disabled, or the whole throttle is.
	Signals [decision.NumSignals]decision.Rule
}

// Resource is one level the lines hold.
type Resource struct {
	// Name keys the resource's level ("cpu", "memory") and its lines in
	// the JSON documents.
	Name string
	// Averaged: the level has slow and fast averages beside it
	// ("cpu_slow", "cpu_fast").
	Averaged bool
	// Lines are its lines.
	Lines decision.Slot
}

// SignalStatus is one signal's live state and counters.
type SignalStatus struct {
	State decision.State
	// DropProbability is the current probability of refusing a request at
	// the receivers' entrance (1 in Open, 0 in Normal; for an exempt signal
	// 1 at the memory backstop, the ramp after it, 0 otherwise).
	DropProbability float64
	// Allowed and the Denied* counts are cumulative since start.
	Allowed      uint64
	DeniedShed   uint64
	DeniedOpen   uint64
	DeniedBudget uint64
	// CutOff counts the allowed requests cut off before their end (told
	// to retry), cumulative since start.
	CutOff uint64
}

// LiveStatus is the current state, read on every /status request.
type LiveStatus struct {
	// At is when the water level was sampled; zero before the first sample.
	At time.Time
	// Levels are the resources' levels, in the order of Info.Resources.
	Levels [sampler.MaxResources]sampler.Level
	// WorkingSet and MemLimit are the bytes behind the memory level
	// (MemLimit 0 = none).
	WorkingSet uint64
	MemLimit   uint64
	// Cores is the effective number of cores CPU is normalised by.
	Cores float64
	// Stale is true when the sampler has not published for a while (it is
	// stuck or read failures skip frames): the levels shown are old.
	Stale bool
	// Signals is indexed by decision.Signal.
	Signals [decision.NumSignals]SignalStatus
	// BudgetReserved and BudgetLimit are the admission budget's bytes in
	// flight and its size (0 = disabled); BudgetPeak the most reserved since
	// the start; HeldRequests the requests held now.
	BudgetReserved int64
	BudgetLimit    int64
	BudgetPeak     int64
	HeldRequests   int64
	// Keys are the client keys that hold the most of the budget and of
	// the hold, or were refused or admitted the most lately, then the
	// others summed (named "other").
	Keys []KeyStatus
	// Go is the Go runtime's memory settings in force.
	Go GoRuntime
	// Transitions are the recent state changes, newest first.
	Transitions []Transition
}

// KeyStatus is what one client key holds and how its requests fared in the
// last 10 to 20 s.
type KeyStatus struct {
	Name     string
	Reserved int64
	Held     int32
	Admitted int64
	Refused  int64
}

// GoRuntime is the soft memory limit and the GC percent in force, and who
// set them (the throttle may own both).
type GoRuntime struct {
	// MemoryLimit is the soft memory limit in bytes (GOMEMLIMIT); 0: none.
	MemoryLimit      int64
	MemoryLimitSetBy string
	// GCPercent is the GC percent (GOGC); 0: the collector is off.
	GCPercent      int64
	GCPercentSetBy string
}

// Sample converts the live status into a history sample with the totals of
// every signal's counters; convenient for the extension's OnSample hook.
func (l *LiveStatus) Sample() Sample {
	s := Sample{At: l.At, Levels: SampleLevels(&l.Levels), WorkingSet: share(l.WorkingSet, l.MemLimit)}
	for i := range l.Signals {
		st := &l.Signals[i]
		s.States[i] = st.State
		s.Allowed += st.Allowed
		s.Denied += st.DeniedShed + st.DeniedOpen + st.DeniedBudget
	}
	return s
}

// MaxHistorySamples bounds the samples one /status/history response holds, so
// that a client asking for the whole ring (up to MaxCapacity samples) costs
// the collector a bounded amount of work per request; the page pages through
// the rest.
const MaxHistorySamples = 1000

// Handler serves the status endpoint:
//
//	GET /                -> the HTML page
//	GET /status          -> JSON of the current status (statusJSON)
//	GET /status/history  -> JSON of the ring's samples, oldest first, at most
//	                        ?limit=N of them (1 to MaxHistorySamples, the
//	                        default). With ?since=<unix ms> or
//	                        ?since=<RFC 3339>: the oldest ones taken after
//	                        since, and "more": true when later ones were
//	                        left out (ask again with since = the last "t").
//	                        Without since: the newest ones.
//
// Anything else is 404, other methods than GET and HEAD 405.
//
// A request whose Host header names anything but an IP address, localhost,
// or the host of endpoint (the configured listen address, host:port) is
// refused with 403: the page has no authentication, and this is what stops a
// web page in a browser on the same host or network from reading it through
// DNS rebinding (pointing its own name at the collector's address), since
// that request carries the attacker's name. The port is not checked: such a
// request has to use the collector's port anyway. A user who opens the page by
// another name (a pod's DNS name with endpoint 0.0.0.0:port) uses the IP
// address, a port-forward to localhost, or that name as the endpoint's host.
//
// The page uses relative URLs, so the handler also works under
// http.StripPrefix. A nil ring, info or live serves empty values.
func Handler(ring *Ring, info func() Info, live func() LiveStatus, endpoint string) http.Handler {
	return &handler{ring: ring, info: info, live: live, now: time.Now, listenHost: listenHost(endpoint)}
}

type handler struct {
	ring *Ring
	info func() Info
	live func() LiveStatus
	now  func() time.Time
	// listenHost is the endpoint's host name, normalised; "" when it is an
	// IP address, empty or unparsable (nothing to add to the IP rule).
	listenHost string
}

// listenHost returns the host name of a host:port listen address, "" when
// there is none beyond what hostAllowed accepts anyway.
func listenHost(endpoint string) string {
	host, _, err := net.SplitHostPort(endpoint)
	if err != nil {
		return ""
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return ""
	}
	return normalHost(host)
}

// normalHost lower-cases a host name and drops a trailing dot, the forms a
// browser may send for the same name.
func normalHost(host string) string {
	return strings.TrimSuffix(strings.ToLower(host), ".")
}

// hostAllowed applies the Host rule described at Handler. hostport is
// r.Host: "name", "name:port", "[v6]" or "[v6]:port".
func (h *handler) hostAllowed(hostport string) bool {
	if hostport == "" {
		// HTTP/1.0 without Host: no browser sends that, so it cannot be a
		// rebinding attack.
		return true
	}
	host := hostport
	if hh, _, err := net.SplitHostPort(hostport); err == nil {
		host = hh
	} else if strings.HasPrefix(host, "[") && strings.HasSuffix(host, "]") {
		host = host[1 : len(host)-1]
	}
	// A zone in an IPv6 literal is sent escaped ("[fe80::1%25eth0]").
	if _, err := netip.ParseAddr(strings.Replace(host, "%25", "%", 1)); err == nil {
		return true
	}
	host = normalHost(host)
	return host == "localhost" || (h.listenHost != "" && host == h.listenHost)
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.hostAllowed(r.Host) {
		http.Error(w, "throttle status: Host "+strconv.Quote(r.Host)+" refused (DNS rebinding protection); "+
			"open the page by IP address, as localhost, or by the host name of the status endpoint setting",
			http.StatusForbidden)
		return
	}
	var serve func(http.ResponseWriter, *http.Request)
	switch r.URL.Path {
	case "/", "":
		serve = h.page
	case "/status":
		serve = h.status
	case "/status/history":
		serve = h.history
	default:
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	serve(w, r)
}

func (h *handler) page(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", pageCSP)
	w.Header().Set("Content-Length", strconv.Itoa(len(pageHTML)))
	_, _ = w.Write(pageHTML)
}

// JSON documents. Field names are the API of the status endpoint (and the
// page's input): change them together with page.html and the tests.

type thresholdJSON struct {
	Enabled bool    `json:"enabled"`
	Enter   float64 `json:"enter"`
	Exit    float64 `json:"exit"`
	Hard    float64 `json:"hard"`
	BreachN int     `json:"breach_n"`
}

type deniedJSON struct {
	Shed   uint64 `json:"shed"`
	Open   uint64 `json:"open"`
	Budget uint64 `json:"budget"`
}

type signalJSON struct {
	Name            string     `json:"name"`
	Enabled         bool       `json:"enabled"`
	DropMin         float64    `json:"drop_min"`
	DropMax         float64    `json:"drop_max"`
	State           string     `json:"state"`
	StateCode       uint8      `json:"state_code"`
	DropProbability float64    `json:"drop_probability"`
	Allowed         uint64     `json:"allowed"`
	Denied          deniedJSON `json:"denied"`
	CutOff          uint64     `json:"cut_off"`
}

type budgetJSON struct {
	Reserved     int64 `json:"reserved"`
	Limit        int64 `json:"limit"`
	Peak         int64 `json:"peak"`
	HeldRequests int64 `json:"held_requests"`
}

type keyJSON struct {
	Key      string `json:"key"`
	Reserved int64  `json:"reserved"`
	Held     int32  `json:"held"`
	Admitted int64  `json:"admitted"`
	Refused  int64  `json:"refused"`
}

type historyInfoJSON struct {
	WindowMs   int64 `json:"window_ms"`
	Capacity   int   `json:"capacity"`
	Length     int   `json:"length"`
	MinGapMs   int64 `json:"min_gap_ms"`
	IntervalMs int64 `json:"interval_ms"`
}

type goJSON struct {
	MemoryLimit      int64  `json:"memory_limit"`
	MemoryLimitSetBy string `json:"memory_limit_set_by"`
	GCPercent        int64  `json:"gc_percent"`
	GCPercentSetBy   string `json:"gc_percent_set_by"`
}

type transitionJSON struct {
	T       int64    `json:"t"` // unix ms
	Signals []string `json:"signals"`
	From    string   `json:"from"`
	To      string   `json:"to"`
	Why     string   `json:"why"`
}

type statusJSON struct {
	Now         int64  `json:"now"`  // server clock, unix ms
	Time        int64  `json:"time"` // sample time, unix ms (0 before the first)
	Stale       bool   `json:"stale"`
	ObserveOnly bool   `json:"observe_only"`
	Source      string `json:"source"`
	// Level holds each resource's level under its name ("cpu"), its
	// averages ("cpu_slow", "cpu_fast") and validity ("cpu_valid"), and
	// the bytes and cores behind them.
	Level       map[string]any           `json:"level"`
	Thresholds  map[string]thresholdJSON `json:"thresholds"`
	Signals     []signalJSON             `json:"signals"`
	Budget      budgetJSON               `json:"budget"`
	Keys        []keyJSON                `json:"keys"`
	Go          goJSON                   `json:"go"`
	Transitions []transitionJSON         `json:"transitions"`
	History     historyInfoJSON          `json:"history"`
	// Config is the effective configuration, {} when none was given.
	Config map[string]any `json:"config"`
}

// sampleJSON is one sample: "t" (unix ms), the levels keyed as in
// statusJSON.Level, "memory_working_set", "states", "allowed", "denied".
type sampleJSON map[string]any

type historyJSON struct {
	Now      int64        `json:"now"`
	WindowMs int64        `json:"window_ms"`
	Samples  []sampleJSON `json:"samples"`
	// More is true when samples after the last one were left out.
	More bool `json:"more"`
}

func (h *handler) status(w http.ResponseWriter, _ *http.Request) {
	var in Info
	if h.info != nil {
		in = h.info()
	}
	var l LiveStatus
	if h.live != nil {
		l = h.live()
	}
	doc := statusJSON{
		Now:         h.now().UnixMilli(),
		Time:        unixMs(l.At),
		Stale:       l.Stale,
		ObserveOnly: in.ObserveOnly,
		Source:      in.Source,
		Level:       map[string]any{"working_set": l.WorkingSet, "memory_limit": l.MemLimit, "cores": finite(l.Cores)},
		Thresholds:  make(map[string]thresholdJSON, len(in.Resources)),
		Signals:     make([]signalJSON, decision.NumSignals),
		Budget:      budgetJSON{Reserved: l.BudgetReserved, Limit: l.BudgetLimit, Peak: l.BudgetPeak, HeldRequests: l.HeldRequests},
		Keys:        make([]keyJSON, 0, len(l.Keys)),
		Go: goJSON{
			MemoryLimit: l.Go.MemoryLimit, MemoryLimitSetBy: l.Go.MemoryLimitSetBy,
			GCPercent: l.Go.GCPercent, GCPercentSetBy: l.Go.GCPercentSetBy,
		},
		Transitions: make([]transitionJSON, len(l.Transitions)),
		History: historyInfoJSON{
			WindowMs:   Window.Milliseconds(),
			IntervalMs: in.SampleInterval.Milliseconds(),
		},
		Config: in.Config,
	}
	for _, k := range l.Keys {
		doc.Keys = append(doc.Keys, keyJSON{Key: k.Name, Reserved: k.Reserved, Held: k.Held, Admitted: k.Admitted, Refused: k.Refused})
	}
	if doc.Config == nil {
		doc.Config = map[string]any{}
	}
	for i, r := range in.Resources[:min(len(in.Resources), sampler.MaxResources)] {
		v := &l.Levels[i]
		putLevel(doc.Level, r, finite(v.Value), finite(v.Slow), finite(v.Fast), v.Valid)
		doc.Thresholds[r.Name] = thresholdOf(r.Lines)
	}
	for i, tr := range l.Transitions {
		o := &doc.Transitions[i]
		*o = transitionJSON{T: unixMs(tr.At), Signals: []string{}, From: tr.From.String(), To: tr.To.String(), Why: tr.Why}
		for s, ok := range tr.Signals {
			if ok {
				o.Signals = append(o.Signals, decision.Signal(s).String())
			}
		}
	}
	if h.ring != nil {
		doc.History.Capacity = h.ring.Cap()
		doc.History.Length = h.ring.Len()
		doc.History.MinGapMs = h.ring.MinGap().Milliseconds()
	}
	for i := range doc.Signals {
		rule, st := in.Signals[i], l.Signals[i]
		doc.Signals[i] = signalJSON{
			Name:            decision.Signal(i).String(),
			Enabled:         rule.Enabled,
			DropMin:         finite(rule.DropMin),
			DropMax:         finite(rule.DropMax),
			State:           st.State.String(),
			StateCode:       uint8(st.State),
			DropProbability: finite(st.DropProbability),
			Allowed:         st.Allowed,
			Denied:          deniedJSON{Shed: st.DeniedShed, Open: st.DeniedOpen, Budget: st.DeniedBudget},
			CutOff:          st.CutOff,
		}
	}
	writeJSON(w, &doc)
}

func (h *handler) history(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	var since time.Time
	if v := q.Get("since"); v != "" {
		var ok bool
		if since, ok = parseSince(v); !ok {
			http.Error(w, "since: want unix milliseconds or an RFC 3339 time", http.StatusBadRequest)
			return
		}
	}
	limit := MaxHistorySamples
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			http.Error(w, "limit: want a positive number of samples", http.StatusBadRequest)
			return
		}
		limit = min(n, MaxHistorySamples)
	}
	doc := historyJSON{Now: h.now().UnixMilli(), WindowMs: Window.Milliseconds(), Samples: []sampleJSON{}}
	var in Info
	if h.info != nil {
		in = h.info()
	}
	if h.ring != nil {
		var samples []Sample
		if since.IsZero() {
			samples = h.ring.Last(limit)
		} else {
			samples, doc.More = h.ring.After(since, limit)
		}
		doc.Samples = make([]sampleJSON, len(samples))
		for i := range samples {
			s := &samples[i]
			var states [decision.NumSignals]uint8
			for j, st := range s.States {
				states[j] = uint8(st)
			}
			o := sampleJSON{
				"t": unixMs(s.At), "memory_working_set": round4(s.WorkingSet),
				"states": states, "allowed": s.Allowed, "denied": s.Denied,
			}
			for j, r := range in.Resources[:min(len(in.Resources), sampler.MaxResources)] {
				v := &s.Levels[j]
				putLevel(o, r, round4(float64(v.Value)), round4(float64(v.Slow)), round4(float64(v.Fast)), v.Valid)
			}
			doc.Samples[i] = o
		}
	}
	writeJSON(w, &doc)
}

// parseSince reads the history cursor. Unix milliseconds mean "after that
// millisecond": the page passes back the truncated t of the last sample it
// has, and must not get that sample again.
func parseSince(v string) (time.Time, bool) {
	if ms, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.UnixMilli(ms).Add(time.Millisecond - time.Nanosecond), true
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	return t, err == nil
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// putLevel keys one resource's level in m: its value under its name, its
// averages (when it has them) and its validity.
func putLevel(m map[string]any, r Resource, value, slow, fast float64, valid bool) {
	m[r.Name] = value
	if r.Averaged {
		m[r.Name+"_slow"], m[r.Name+"_fast"] = slow, fast
	}
	m[r.Name+"_valid"] = valid
}

func thresholdOf(t decision.Slot) thresholdJSON {
	return thresholdJSON{Enabled: t.Enabled, Enter: finite(t.Enter), Exit: finite(t.Exit), Hard: finite(t.Hard), BreachN: t.BreachN}
}

// share is part over whole, 0 without a whole.
func share(part, whole uint64) float64 {
	if whole == 0 {
		return 0
	}
	return float64(part) / float64(whole)
}

func unixMs(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

// finite keeps a NaN or infinite level (an invalid reading) from failing the
// whole JSON document; the *_valid flags tell the reader.
func finite(f float64) float64 {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return 0
	}
	return f
}

// round4 trims history values to 4 decimals: 0.01 % is far below what a chart
// shows and it keeps a history document small.
func round4(f float64) float64 {
	f = finite(f)
	if math.Abs(f) > 1e9 { // f*1e4 would lose more than it saves
		return f
	}
	return math.Round(f*1e4) / 1e4
}
