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
	"context"
	"errors"
	"math/rand/v2"
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
	// An exempt signal reports (false, 0) except at the memory backstop.
	Pressure(s decision.Signal) (open bool, drop float64)
	// Exempt reports whether s is exempt from the throttle (its rule has
	// enabled: false, or the whole throttle is disabled): it is bounded by
	// the budget, with a reserve the others cannot take.
	Exempt(s decision.Signal) bool
	// Pressed reports whether the collector is under pressure for s: not
	// Normal, or a water level past its exit line. Only then is a key's
	// use of the oversize lane bounded.
	Pressed(s decision.Signal) bool
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

// Recorder counts decisions, once per request decided, on the request
// path: it must not block and should not allocate.
type Recorder interface {
	Record(p Protocol, s decision.Signal, v decision.Verdict)
}

type nopRecorder struct{}

func (nopRecorder) Record(Protocol, decision.Signal, decision.Verdict) {}

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
	source         KeySource
	headerHTTP     string
	headerGRPC     string
	authAttr       string
	trusted        []netip.Prefix
	forwardedHTTP  [2]string
	forwardedGRPC  [2]string
	unknownSize    int64
	grpcMaxMessage int64
	closed         atomic.Bool
	closing        chan struct{}
	tickets        ticketSet
	shutdownGrace  time.Duration
	laneTenure     time.Duration
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
		unknownSize:    int64(cfg.UnknownSize),
		grpcMaxMessage: int64(cfg.GRPCMaxMessageSize),
		closing:        make(chan struct{}),
		shutdownGrace:  shutdownGrace,
		laneTenure:     laneTenureFactor * cfg.IdleTimeout,
		forwardedHTTP:  [2]string{"Forwarded", "X-Forwarded-For"},
		forwardedGRPC:  [2]string{"forwarded", "x-forwarded-for"},
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

// decide is the decision for one request of key k and sig: the signal's
// state, and while it sheds, the key's fair drop (see recountDrops). One
// atomic load when the signal is Normal.
func (c *Controller) decide(k Key, sig decision.Signal) decision.Verdict {
	open, p := c.dec.Pressure(sig)
	switch {
	case open:
		return decision.VerdictDenyOpen
	case !(p > 0):
		return decision.VerdictAdmit
	}
	if rand.Uint64()>>11 < c.keys.dropThreshold(k, sig, p) {
		return decision.VerdictDenyShed
	}
	return decision.VerdictAdmit
}

// Admit decides a request and returns its ticket when it is admitted. An
// HTTP request the decision refuses waits in the hold, its body unread,
// until a decision admits it or it has waited max_wait; a gRPC call
// (decided on the connection's reader goroutine, which must not block) is
// let in to wait in Ticket.Start instead. It returns the ticket and
// VerdictAdmit, or nil and the denial to answer with; in observe-only mode
// every request is admitted and the denial it would have had is counted.
// Deciding and refusing allocate nothing.
func (c *Controller) Admit(ctx context.Context, req Request) (*Ticket, decision.Verdict) {
	at := now()
	k := c.key(req)
	c.keys.touch(k, req.Signal, at, c.dec)
	v := c.decide(k, req.Signal)
	if !v.Admitted() {
		switch {
		case c.observe:
			return c.newTicket(ctx, k, req, at).admitted(v)
		case req.Protocol == ProtocolGRPC:
			// Waits in Ticket.Start, with a place in the hold and what its
			// client sends meanwhile counted in the held pool.
			if n, ok := c.takeHeld(k, req.Signal, at); ok {
				return c.newTicket(ctx, k, req, at).pending(v, n)
			}
			return nil, c.refuse(k, req, at, v)
		case !c.hold.takePlace(k):
			return nil, c.refuse(k, req, at, v)
		}
		v = c.hold.wait(ctx, k, req.Signal, v, c.hold.maxWait)
		c.hold.freePlace(k)
		if !v.Admitted() {
			return nil, c.refuse(k, req, at, v)
		}
	}
	if c.budget == nil {
		return c.newTicket(ctx, k, req, at).admitted(decision.VerdictAdmit)
	}
	exempt := c.dec.Exempt(req.Signal)
	if req.Protocol == ProtocolGRPC {
		return c.admitCall(ctx, k, req, at, exempt)
	}
	// A key at its share, or one that owes the oversize lane under
	// pressure, is refused what it could not have, before it is read.
	lim, plim := c.budget.limitOf(k, at)
	if !exempt && c.keys.room(k, lim, plim) <= 0 ||
		(req.Length < 0 || req.Length > lim) && c.budget.laneIndebted(k, at) && c.dec.Pressed(req.Signal) {
		c.keys.noteRefused(k, at)
		if c.observe {
			return c.newTicket(ctx, k, req, at).admitted(decision.VerdictDenyBudget)
		}
		return nil, c.refuse(k, req, at, decision.VerdictDenyBudget)
	}
	return c.newTicket(ctx, k, req, at).admitted(decision.VerdictAdmit)
}

// admitCall admits a gRPC call the decision admits, with its estimate
// reserved (Start reserves what its message may decode to before it is
// read), or to wait for it in Ticket.Start.
func (c *Controller) admitCall(ctx context.Context, k Key, req Request, at time.Duration, exempt bool) (*Ticket, decision.Verdict) {
	n := c.estimate(k, req.Signal, exempt, at)
	switch {
	case c.budget.admitNow(n, k, exempt, at):
		t := c.newTicket(ctx, k, req, at)
		t.reserved = n
		return t.admitted(decision.VerdictAdmit)
	case c.observe:
		c.budget.charge(n, k)
		t := c.newTicket(ctx, k, req, at)
		t.reserved = n
		return t.admitted(decision.VerdictDenyBudget)
	case c.cfg.WaitTimeout > 0:
		if held, ok := c.takeHeld(k, req.Signal, at); ok {
			return c.newTicket(ctx, k, req, at).pending(decision.VerdictAdmit, held)
		}
	}
	return nil, c.refuse(k, req, at, decision.VerdictDenyBudget)
}

// minEstimate is the least a gRPC call's estimate is, so that one learnt
// from empty messages still counts every call.
const minEstimate = 4 << 10

// maxOvercommit bounds how far below a message's decoded size a call's
// estimate may be: wire size, as an HTTP body starts with its
// Content-Length, but at least a quarter of the decoded size.
const maxOvercommit = 4

// estimate is what a gRPC call of k and sig reserves at the tap: the
// largest message of an accepted call of that key and signal lately as it
// came on the wire, but at least a quarter of the largest decoded one
// (unknown_size before any), at least minEstimate, at most its key's
// share and what it may ever hold (budget.most). It only decides whether the call is let in at once and bounds
// what its client may send before the call starts; Start then reserves
// what the message may decode to (callSize), whatever the estimate says.
func (c *Controller) estimate(k Key, sig decision.Signal, exempt bool, at time.Duration) int64 {
	n := c.keys.sizeOf(k, sig, at, false)
	if n == 0 {
		n = c.unknownSize
	} else if w := c.keys.sizeOf(k, sig, at, true); w > 0 {
		n = max(min(w, n), n/maxOvercommit)
	}
	n = max(n, min(minEstimate, c.unknownSize))
	lim, plim := c.budget.limitOf(k, at)
	return max(min(n, lim, plim, c.budget.most(exempt)), 1)
}

// callSize is what a gRPC call of k reserves from before its message is
// read until it has been decoded: what grpc-go may decode for it, at most
// its key's share and what it may ever hold of the budget (budget.most:
// asking for more, it would wait for ever). Nothing smaller is safe: grpc-go
// decompresses and decodes the whole message before anything sees its
// size, and a client's earlier messages say nothing of its next one.
func (c *Controller) callSize(k Key, exempt bool, at time.Duration) int64 {
	b := c.budget
	lim, plim := b.limitOf(k, at)
	return max(min(c.grpcMaxMessage, lim, plim, b.most(exempt)), 1)
}

// takeHeld takes a hold place for a gRPC call of k and sig that waits, and
// counts in the held pool what its client can send meanwhile (its stream's
// flow-control window, or its key's largest recent message on the wire):
// false when either is full.
func (c *Controller) takeHeld(k Key, sig decision.Signal, at time.Duration) (int64, bool) {
	if !c.hold.takePlace(k) {
		return 0, false
	}
	n := int64(0)
	if c.budget != nil {
		n = max(heldWindow, c.keys.sizeOf(k, sig, at, true))
		if !c.budget.reserveHeld(n) {
			c.hold.freePlace(k)
			return 0, false
		}
	}
	return n, true
}

// newTicket returns the ticket of an admitted (or waiting) request.
func (c *Controller) newTicket(ctx context.Context, k Key, req Request, at time.Duration) *Ticket {
	return &Ticket{
		c: c, ctx: ctx, key: k, sig: req.Signal, proto: req.Protocol, age: at, known: req.Length,
		exempt: c.budget != nil && c.dec.Exempt(req.Signal),
	}
}

// refuse records a refusal of req and returns it.
func (c *Controller) refuse(k Key, req Request, at time.Duration, v decision.Verdict) decision.Verdict {
	c.rec.Record(req.Protocol, req.Signal, v)
	c.keys.noteDecision(k, false, at)
	if v == decision.VerdictDenyBudget {
		c.keys.noteRefused(k, at)
	}
	return v
}

// key is the fairness key of req.
func (c *Controller) key(req Request) Key {
	origin := req.Remote.Unmap()
	if req.Header != nil && len(c.trusted) > 0 && c.isTrusted(origin) {
		origin = c.forwarded(origin, req)
	}
	var tenant string
	switch c.source {
	case KeyHeader:
		if req.Header != nil {
			name := c.headerHTTP
			if req.Protocol == ProtocolGRPC {
				name = c.headerGRPC
			}
			if vs := req.Header.Values(name); len(vs) > 0 {
				tenant = vs[0]
			}
		}
	case KeyAuth:
		if req.Auth != nil {
			if s, ok := req.Auth.GetAttribute(c.authAttr).(string); ok {
				tenant = s
			}
		}
	}
	return c.keys.key(origin, tenant)
}

func (c *Controller) isTrusted(a netip.Addr) bool {
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// forwarded returns the client's address a trusted proxy forwards: the
// last address of the Forwarded (for=) or X-Forwarded-For chain that is not
// itself a trusted proxy, the remote address when there is none.
func (c *Controller) forwarded(remote netip.Addr, req Request) netip.Addr {
	names := c.forwardedHTTP
	if req.Protocol == ProtocolGRPC {
		names = c.forwardedGRPC
	}
	for i, name := range names {
		vs := req.Header.Values(name)
		if len(vs) == 0 {
			continue
		}
		for j := len(vs) - 1; j >= 0; j-- {
			v := vs[j]
			for v != "" {
				cut := strings.LastIndexByte(v, ',')
				elem := v[cut+1:]
				v = v[:max(cut, 0)]
				a, ok := forwardedAddr(elem, i == 0)
				if !ok {
					return remote // a chain we cannot read: trust none of it
				}
				if !c.isTrusted(a) {
					return a
				}
				remote = a
			}
		}
		return remote // the chain is all trusted proxies: the first of them
	}
	return remote
}

// forwardedAddr reads one element of a Forwarded (RFC 7239, its for=
// parameter) or X-Forwarded-For header.
func forwardedAddr(elem string, rfc7239 bool) (netip.Addr, bool) {
	elem = strings.TrimSpace(elem)
	if rfc7239 {
		found := false
		for part := range strings.SplitSeq(elem, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
			if ok && strings.EqualFold(k, "for") {
				elem, found = strings.Trim(v, `"`), true
				break
			}
		}
		if !found {
			return netip.Addr{}, false
		}
	}
	if ap, err := netip.ParseAddrPort(elem); err == nil {
		return ap.Addr().Unmap(), true
	}
	elem = strings.TrimSuffix(strings.TrimPrefix(elem, "["), "]")
	a, err := netip.ParseAddr(elem)
	return a.Unmap(), err == nil
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
	// Peak is the most Reserved has been since the start: a reservation
	// never takes it past Budget; only gRPC messages larger than their
	// reservation, and the oversize lane's bodies, are counted beyond.
	Peak int64
	// Held is what waiting gRPC streams are expected to buffer.
	Held int64
	// HeldRequests is the number of requests held; Inflight the admitted
	// requests not finished.
	HeldRequests, Inflight int64
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
