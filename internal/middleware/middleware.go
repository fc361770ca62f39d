// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package middleware // import "github.com/otelthrottle/throttle/internal/middleware"

import (
	"errors"
	"time"

	"github.com/otelthrottle/throttle/internal/decision"
)

// DefaultUnknownSize is the reservation of a request whose size is not known
// up front (admission.unknown_size default).
const DefaultUnknownSize = 1 << 20

// DefaultIdleTimeout is admission.idle_timeout's default: far above the
// stalls of a healthy connection (TCP's retransmission timeouts back off
// from 1s), so only a client that has stopped sending is cut.
const DefaultIdleTimeout = 10 * time.Second

// Decider makes the admission decision for a classified request.
// *decision.Engine satisfies Decide; the extension adds Exempt.
type Decider interface {
	// Decide returns the verdict for one request of signal s. It is called
	// on the request path (for gRPC on the connection's reader goroutine):
	// it must not block and should not allocate. It never returns
	// DenyBudget.
	Decide(s decision.Signal) decision.Verdict
	// Exempt reports whether s is exempt from the throttle (its rule has
	// enabled: false, or the whole throttle is disabled). Decide admits an
	// exempt signal except at the memory backstop; the admission budget
	// bounds it, with an overdraft of a second budget (Budget.admitExempt).
	Exempt(s decision.Signal) bool
	// Pressed reports whether the collector is under pressure for signal
	// s: not Normal, or a water level past its exit line. Only then is a
	// peer's use of the oversize lane bounded (see Peers.laneAllowed). Called off the
	// decision path, once per body that needs the lane.
	Pressed(s decision.Signal) bool
}

// Config configures the HTTP and gRPC middleware.
type Config struct {
	// Classifier maps requests to signals. Required.
	Classifier *Classifier
	// Decider decides for classified requests. Required.
	Decider Decider
	// Retry draws the announced retry delays. Nil means 0s to
	// DefaultRetryCeiling.
	Retry *RetryDelay
	// Budget bounds the bytes of admitted, unfinished requests. Nil means
	// no budget. Share one Budget between all servers of an extension.
	Budget *Budget
	// Peers tells the remote peers apart for the per-peer limits of the
	// budget and the hold. Nil means the budget's (or, without a budget,
	// one of the middleware's own). Share one between all servers.
	Peers *Peers
	// Inflight counts the admitted, unfinished requests. Nil means none.
	// Share one between all servers.
	Inflight *Inflight
	// UnknownSize is what a request reserves first while no size has been
	// learnt for its signal on that server: an HTTP body of unknown length
	// (chunked, or compressed, since confighttp drops the length when it
	// sets up decompression) and a gRPC call. <= 0 means
	// DefaultUnknownSize. It is capped at the budget's size.
	UnknownSize int64
	// IdleTimeout bounds how long an admitted request may hold budget
	// without progress: an HTTP body that receives less than 64 KiB in
	// this long fails with a retryable error, an HTTP body this old keeps
	// at most 64 KiB reserved beyond what it has received, and a gRPC call
	// that has not sent its first message by then keeps only minEstimate
	// reserved (and is cancelled after silentFactor times as long). 0
	// means none of this.
	IdleTimeout time.Duration
	// Recorder counts every decision. Nil means NopRecorder.
	Recorder Recorder
	// Tarpit holds HTTP shed and budget rejections before they are
	// answered. Nil means none. Share one Tarpit between all servers of an
	// extension.
	Tarpit *Tarpit
	// Hold holds HTTP requests the decision refuses, until a later
	// decision admits them or they have waited long enough. Nil means none.
	// Share one Hold between all servers of an extension.
	Hold *Hold
	// Unclassified is told of every request whose HTTP path or gRPC method
	// is no known signal's: such requests are let through untouched, so a
	// receiver serving a custom path without a matching route is not
	// protected. Nil means nothing. Called on the request path: it must not
	// block (the extension counts and logs a bounded number of paths).
	Unclassified func(p Protocol, path string)
	// ObserveOnly makes and counts every decision but refuses nothing: a
	// request the decision or the budget would refuse is counted as that
	// denial and let in, never held, and a body is never cut off nor failed
	// for the budget.
	ObserveOnly bool
}

// settings is a validated Config with defaults applied.
type settings struct {
	cls         *Classifier
	dec         Decider
	retry       *RetryDelay
	budget      *Budget
	peers       *Peers
	inflight    *Inflight
	unknownSize int64
	idle        time.Duration
	rec         Recorder
	tarpit      *Tarpit
	hold        *Hold
	rejections  *grpcRejections
	observe     bool
	onUnknown   func(Protocol, string)
}

func newSettings(cfg Config) (settings, error) {
	if cfg.Classifier == nil {
		return settings{}, errors.New("middleware: Classifier is required")
	}
	if cfg.Decider == nil {
		return settings{}, errors.New("middleware: Decider is required")
	}
	s := settings{
		cls:         cfg.Classifier,
		dec:         cfg.Decider,
		retry:       cfg.Retry,
		tarpit:      cfg.Tarpit,
		hold:        cfg.Hold,
		budget:      cfg.Budget,
		peers:       cfg.Peers,
		inflight:    cfg.Inflight,
		unknownSize: cfg.UnknownSize,
		idle:        max(cfg.IdleTimeout, 0),
		observe:     cfg.ObserveOnly,
		rec:         cfg.Recorder,
		onUnknown:   cfg.Unclassified,
	}
	if s.peers == nil {
		s.peers = s.budget.Peers()
	}
	if s.peers == nil {
		s.peers = NewPeers(DefaultPeerShare)
	}
	if s.observe {
		// Cutting off an idle body and holding a request are refusals too.
		s.idle, s.hold = 0, nil
	}
	if s.retry == nil {
		s.retry = NewRetryDelay(DefaultRetryFloor, DefaultRetryCeiling, nil, nil)
	}
	if s.unknownSize <= 0 {
		s.unknownSize = DefaultUnknownSize
	}
	if s.budget != nil {
		// A reservation larger than the whole budget could never be made:
		// every such request would be refused for ever.
		s.unknownSize = min(s.unknownSize, s.budget.Max())
	}
	if s.rec == nil {
		s.rec = NopRecorder{}
	}
	s.rejections = newGRPCRejections(s.retry)
	return s, nil
}

// unclassified tells Config.Unclassified of a request no route matched.
func (s *settings) unclassified(p Protocol, path string) {
	if s.onUnknown != nil {
		s.onUnknown(p, path)
	}
}
