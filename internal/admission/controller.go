// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

// Package admission decides, for each request that reaches a receiver,
// whether it is admitted, held or refused before its body is read, and
// bounds the bytes of admitted, unfinished requests: the budget, each
// client key's fair share of it, the oversize lane, the hold, and the fair
// drops under pressure.
//
// A request goes through a Ticket: Controller.Admit decides it (holding
// it while the decision refuses, if it may wait), Ticket.Start readies it
// (a gRPC call waits there for what its message may decode to), an HTTP
// body reads through Ticket.Read, which reserves bytes before it reads
// them, a gRPC call is charged its message's size in Ticket.Decoded, and
// Ticket.Release gives everything back.
package admission // import "github.com/otelthrottle/throttle/internal/admission"

import (
	"errors"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// Decider is what the controller asks of the throttle's state machines.
type Decider interface {
	// Pressure returns whether signal s refuses everything (Open) and
	// otherwise its drop probability: one atomic load, never blocking.
	// An exempt signal reports (true, _) at the memory backstop, the
	// recovery ramp after it, and (false, 0) otherwise.
	Pressure(s decision.Signal) (open bool, drop float64)
	// Exempt reports whether s is exempt from the throttle (its rule has
	// enabled: false, or the whole throttle is disabled): it is bounded by
	// the budget, with a reserve the others cannot take.
	Exempt(s decision.Signal) bool
	// Pressed reports whether the collector is under pressure for s: not
	// Normal, or a water level past its exit line. Only then is a key's
	// use of the oversize lane bounded.
	Pressed(s decision.Signal) bool
	// Holdable reports whether a refusal of s may wait in the hold: false
	// while the pressure has outlasted what the hold can bridge (a slow
	// backend), when a refusal is answered at once.
	Holdable(s decision.Signal) bool
}

// Protocol is where a decision was made; it is the protocol attribute of
// the requests counter.
type Protocol uint8

// The protocols, usable as array indexes.
const (
	ProtocolHTTP Protocol = iota
	ProtocolGRPC
	// ProtocolProcessor is a decision of the throttle processor, which the
	// extension counts with the others.
	ProtocolProcessor
	// NumProtocols is the number of protocols; not a protocol.
	NumProtocols
)

var protocolNames = [NumProtocols]string{"http", "grpc", "processor"}

// String returns the protocol's telemetry name.
func (p Protocol) String() string {
	if p < NumProtocols {
		return protocolNames[p]
	}
	return "unknown"
}

// CutReason is why an admitted request was cut off before its end; it is
// the reason attribute of the cut-off counter.
type CutReason uint8

// The reasons a request is cut off, usable as array indexes.
const (
	// CutBudget: its body waited too long for more of the budget or of the
	// oversize lane, gave way to the other waiting bodies, was kept out of
	// the lane its key owes, or read in the lane past its tenure.
	CutBudget CutReason = iota
	// CutOpen: its signal turned Open while its body waited for bytes.
	CutOpen
	// CutSlow: its client sent too slowly, or sent no message in time.
	CutSlow
	// CutStopping: the receivers were stopping.
	CutStopping
	// NumCutReasons is the number of reasons; not a reason.
	NumCutReasons
)

var cutReasonNames = [NumCutReasons]string{"budget", "open", "slow", "stopping"}

// String returns the reason's telemetry name.
func (r CutReason) String() string {
	if r < NumCutReasons {
		return cutReasonNames[r]
	}
	return "unknown"
}

// Recorder counts decisions, once per request decided, and the admitted
// requests cut off before their end, once per request cut off (they were
// counted admitted, and their clients were told to retry). It is called on
// the request path: it must not block and should not allocate.
type Recorder interface {
	Record(p Protocol, s decision.Signal, v decision.Verdict)
	CutOff(p Protocol, s decision.Signal, r CutReason)
}

type nopRecorder struct{}

func (nopRecorder) Record(Protocol, decision.Signal, decision.Verdict) {}
func (nopRecorder) CutOff(Protocol, decision.Signal, CutReason)        {}

// Header is a request's headers (HTTP) or metadata (gRPC): Values returns
// every value of a header, name given canonical for HTTP and lower-case
// for gRPC.
type Header interface {
	Values(name string) []string
}

// Auth is the authenticated client (client.Info.Auth).
type Auth interface {
	GetAttribute(name string) any
}

// Request is what the controller knows of a request when it arrives.
type Request struct {
	Protocol Protocol
	Signal   decision.Signal
	// Remote is the address the request came from; Header and Auth (nil
	// for none) tell the client apart further, as the fairness section
	// says.
	Remote netip.Addr
	Header Header
	Auth   Auth
	// Length is the body's length when known (HTTP Content-Length), else
	// -1.
	Length int64
}

// Staller cuts a request off: an HTTP body's pending read fails, a gRPC
// call is cancelled (see Ticket.Start).
type Staller interface {
	Stall()
}

// ErrBudget is the error of a read or a wait the budget refuses: the
// client should retry after a short delay.
var ErrBudget = errors.New("throttle: admission budget full")

// ErrOpen is the error of a body read that waited for the budget while its
// signal turned Open: the client should retry later, as when refused Open.
var ErrOpen = errors.New("throttle: signal open")

// ErrIdle is the error of an HTTP body read cut off because its client
// stopped sending.
var ErrIdle = errors.New("throttle: request body too slow")

// Controller is the admission of one extension, shared by all its servers.
// The zero of every part is off: a Controller built with no budget admits
// by the decision alone.
type Controller struct {
	dec      Decider
	rec      Recorder
	keys     *keyTable
	budget   *budget // nil: no budget
	hold     *hold   // nil: no hold
	observe  bool
	cfg      Config
	anyEx    bool
	inflight atomic.Int64

	// source and names of the fairness key.
	source     KeySource
	headerHTTP string
	headerGRPC string
	authAttr   string
	trusted    []netip.Prefix
	// forwardedHTTP and forwardedGRPC name the header the trusted proxies
	// set, rfc7239 whether it is Forwarded.
	forwardedHTTP  string
	forwardedGRPC  string
	rfc7239        bool
	unknownSize    int64
	grpcMaxMessage int64
	closed         atomic.Bool
	closing        chan struct{}
	tickets        ticketSet
	shutdownGrace  time.Duration
	laneTenure     time.Duration
	// trimmed is now() of the last trimSilent; silentGrace its grace.
	trimmed     atomic.Int64
	silentGrace time.Duration
}

// Settings are a Controller's collaborators.
type Settings struct {
	// Decider decides for the signals. Required.
	Decider Decider
	// Recorder counts the decisions; nil counts nothing.
	Recorder Recorder
	// ObserveOnly makes and counts every decision but refuses nothing: a
	// request the decision or the budget would refuse is counted as that
	// denial and let in, never held, never cut off.
	ObserveOnly bool
	// Budget is the budget's size in bytes now (SetBudget follows it);
	// <= 0 with max_inflight_bytes on waits for SetBudget, with it off
	// there is no budget.
	Budget int64
	// HeldPool is the size of the pool of what waiting gRPC streams may
	// buffer; at least the budget's size.
	HeldPool int64
}

// shutdownGrace is how long an unfinished request may go on after the
// receivers start to stop before it is cut off: an honest body in flight
// ends well within it, a trickling one does not delay the shutdown.
const shutdownGrace = time.Second

// laneTenureFactor bounds how long a body may read in the oversize lane,
// in idle timeouts: decompressed bytes can arrive far faster than the
// compressed ones on the wire (gzip'd zeros, a thousand to one), so a body
// trickling on the wire can look like progress; its tenure is bounded
// instead. 30 s at the default idle timeout, far more than a large honest
// batch takes.
const laneTenureFactor = 3

// errDecider is New's error without a Decider.
var errDecider = errors.New("admission: a Decider is required")

// New returns the admission of cfg and hold. The budget is on unless
// max_inflight_bytes is 0; its size is set, and follows the memory limit
// and the cores, through SetBudget.
func New(cfg Config, holdCfg HoldConfig, set Settings) (*Controller, error) {
	if set.Decider == nil {
		return nil, errDecider
	}
	c := &Controller{
		dec:            set.Decider,
		rec:            set.Recorder,
		observe:        set.ObserveOnly,
		cfg:            cfg,
		keys:           newKeyTable(cfg.Fairness),
		source:         cfg.Fairness.Key,
		authAttr:       cfg.Fairness.AuthAttribute,
		unknownSize:    int64(cfg.UnknownSize),        //nolint:gosec // G115: at most 1 TiB (Validate)
		grpcMaxMessage: int64(cfg.GRPCMaxMessageSize), //nolint:gosec // G115: at most 1 TiB (Validate)
		closing:        make(chan struct{}),
		shutdownGrace:  shutdownGrace,
		silentGrace:    silentGrace,
		laneTenure:     laneTenureFactor * cfg.IdleTimeout,
		forwardedHTTP:  DefaultForwardedHeader,
	}
	if c.rec == nil {
		c.rec = nopRecorder{}
	}
	if c.unknownSize <= 0 {
		c.unknownSize = int64(DefaultUnknownSize)
	}
	if c.grpcMaxMessage <= 0 {
		c.grpcMaxMessage = int64(DefaultGRPCMaxMessageSize)
	}
	if cfg.Fairness.Header != "" {
		c.headerHTTP = canonicalHeader(cfg.Fairness.Header)
		c.headerGRPC = strings.ToLower(cfg.Fairness.Header)
	}
	if rfc, err := forwardedName(cfg.Fairness.ForwardedHeader); err == nil && rfc {
		c.forwardedHTTP, c.rfc7239 = "Forwarded", true
	}
	c.forwardedGRPC = strings.ToLower(c.forwardedHTTP)
	for _, p := range cfg.Fairness.TrustedProxies {
		if pf, err := parsePrefix(p); err == nil {
			c.trusted = append(c.trusted, pf)
		}
	}
	for s := range decision.NumSignals {
		c.anyEx = c.anyEx || set.Decider.Exempt(s)
	}
	if !cfg.MaxInflightBytes.IsOff() {
		exemptShare := 0.0
		if c.anyEx {
			exemptShare = exemptReserve
		}
		c.budget = newBudget(max(set.Budget, 1), c.keys, exemptShare)
		c.budget.heldMax.Store(set.HeldPool)
		if !c.observe {
			// observe_only refuses nothing while the receivers run: no
			// silent call is trimmed (at shutdown they are cut off all
			// the same).
			c.budget.onWait = c.trimSilent
			c.keys.onContended = c.trimSilent
		}
	}
	if !c.observe {
		c.hold = newHold(c, holdCfg)
	}
	return c, nil
}

// exemptReserve is the part of the budget only exempt signals may take when
// any signal is exempt: the others filling the budget do not refuse them,
// and every reservation stays within the budget's size.
const exemptReserve = 0.25

// SetBudget resizes the budget and the held pool, as the memory limit or
// the cores they were derived from change. Reservations made under the old
// size stay.
func (c *Controller) SetBudget(budget, heldPool int64) {
	if c.budget == nil {
		return
	}
	c.budget.setMax(budget)
	c.budget.heldMax.Store(heldPool)
}

// canonicalHeader is name as net/http keys it.
func canonicalHeader(name string) string {
	b := []byte(strings.ToLower(name))
	upper := true
	for i, c := range b {
		if upper && 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
		upper = c == '-'
	}
	return string(b)
}

// silentGrace is how long a gRPC call may hold what its message may decode
// to without its message while others wait for the budget: far longer
// than an honest message takes to come over a LAN.
const silentGrace = 2 * time.Second

// trimSilent cuts off (Stall) the gRPC calls that have held what their
// message may decode to for silentGrace without a message, of keys whose
// undecoded calls hold more than their fair share, while requests wait for
// the budget: silent calls kept open cannot hold the budget from the
// others. Their clients retry (CANCELLED), having lost nothing, since they
// sent nothing. At most once per recountEvery.
func (c *Controller) trimSilent(at time.Duration) {
	last := c.trimmed.Load()
	if at-time.Duration(last) < recountEvery || !c.trimmed.CompareAndSwap(last, int64(at)) {
		return
	}
	// The shares as they are now: nothing may have arrived to count them
	// again while everyone waits.
	c.keys.recounted.Store(int64(at))
	c.keys.recount(at, c.dec)
	m := c.budget.max.Load()
	c.tickets.each(func(t *Ticket) {
		if t.proto != ProtocolGRPC {
			return
		}
		t.mu.Lock()
		cut := !t.done && !t.msg && !t.killed && !t.pend && t.decoding > 0 && t.onStall != nil &&
			at-t.age >= c.silentGrace && c.keys.decodingOver(t.key, c.keys.limit(t.key, m, at))
		if cut {
			t.killed = true
		}
		t.mu.Unlock()
		if cut {
			t.cutOff(CutSlow)
			t.onStall.Stall()
		}
	})
}

// Close ends every wait and cuts off every unfinished request within a
// second, and holds nothing more: the receivers are stopping, and their
// servers' shutdown waits for the requests in flight. Idempotent.
func (c *Controller) Close() {
	if !c.closed.CompareAndSwap(false, true) {
		return
	}
	close(c.closing)
	c.hold.close()
	if c.budget != nil {
		c.budget.close()
	}
	c.tickets.each(func(t *Ticket) { t.shutdown(c.shutdownGrace) })
}

// Closing is closed when the receivers start to stop (Close).
func (c *Controller) Closing() <-chan struct{} { return c.closing }

// ObserveOnly reports whether decisions are only counted.
func (c *Controller) ObserveOnly() bool { return c.observe }

// MinBodyRate is the least an HTTP body must receive, n bytes per d, not to
// be cut off with ErrIdle; d is 0 when the idle timeout is off.
func (c *Controller) MinBodyRate() (n int64, d time.Duration) { return readStep, c.cfg.IdleTimeout }

// Stats is the admission's state now, for the telemetry and the status
// page.
type Stats struct {
	// Budget is the budget's size (0: off); Reserved what admitted
	// requests hold of it, gRPC messages larger than their reservation
	// and the oversize lane's bodies included.
	Budget, Reserved int64
	// Peak is the most the budget's reservations have been since the start
	// (the oversize lane's pool apart): a reservation never takes them past
	// Budget; only gRPC messages larger than their reservation are counted
	// beyond.
	Peak int64
	// Held is what waiting gRPC streams are expected to buffer.
	Held int64
	// HeldRequests is the number of requests held; Inflight the admitted
	// requests not finished.
	HeldRequests, Inflight int64
	// Waiting is the number of admitted requests waiting for the budget:
	// bodies for their next bytes, gRPC calls for what their message may
	// decode to.
	Waiting int64
	// Keys is the number of keys that share the budget now.
	Keys int
}

// Stats returns the admission's state now.
func (c *Controller) Stats() Stats {
	s := Stats{HeldRequests: c.hold.count(), Inflight: c.inflight.Load(), Keys: int(c.keys.active.Load())}
	if b := c.budget; b != nil {
		s.Budget = b.max.Load()
		s.Reserved = b.reserved.Load() + b.lane.used.Load()
		s.Peak = b.peak.Load()
		s.Held = b.held.Load()
		// Under the lock that registers a waiter: one counted here has also
		// made the others keep free what it waits for.
		b.mu.Lock()
		s.Waiting = int64(b.waiting.Load() + b.entering.Load())
		b.mu.Unlock()
	}
	return s
}

// TopKeys returns the n keys that hold the most of the budget and of the
// hold, or were refused or admitted the most lately, and the others summed
// as "other".
func (c *Controller) TopKeys(n int) (top []KeyStat, other KeyStat) {
	return c.keys.top(n, now())
}

// ticketSet is the set of unfinished tickets, so that Close can cut them
// off: an intrusive list, no allocation per request.
type ticketSet struct {
	mu   sync.Mutex
	head *Ticket
}

func (s *ticketSet) add(t *Ticket) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t.listed {
		return
	}
	t.next = s.head
	if s.head != nil {
		s.head.prev = t
	}
	s.head = t
	t.listed = true
}

func (s *ticketSet) remove(t *Ticket) {
	s.mu.Lock()
	if t.listed {
		if t.prev != nil {
			t.prev.next = t.next
		} else {
			s.head = t.next
		}
		if t.next != nil {
			t.next.prev = t.prev
		}
		t.prev, t.next, t.listed = nil, nil, false
	}
	s.mu.Unlock()
}

func (s *ticketSet) each(f func(*Ticket)) {
	s.mu.Lock()
	var all []*Ticket
	for t := s.head; t != nil; t = t.next {
		all = append(all, t)
	}
	s.mu.Unlock()
	for _, t := range all {
		f(t)
	}
}
