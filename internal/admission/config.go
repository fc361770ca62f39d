// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package admission // import "github.com/otelthrottle/throttle/internal/admission"

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// The defaults of the admission and hold sections, written once.
const (
	// DefaultUnknownSize is what a body reserves first while no size has
	// been learnt for its key and signal.
	DefaultUnknownSize = MiB
	// DefaultIdleTimeout is far above the stalls of a healthy connection
	// (TCP's retransmission timeouts back off from 1s), so only a client
	// that has stopped sending is cut.
	DefaultIdleTimeout = 10 * time.Second
	// DefaultWaitTimeout is the retry delay of a budget refusal: a body that
	// has been read in part should wait about as long as a refused client
	// would before its retry, rather than fail and be sent again.
	DefaultWaitTimeout = time.Second
	// DefaultGRPCMaxMessageSize is grpc-go's default limit on a received
	// message, which configgrpc keeps unless max_recv_msg_size_mib is set.
	DefaultGRPCMaxMessageSize = 4 * MiB
	// DefaultShare: one key alone may hold half of the budget and of the
	// hold's places, so that one client, or one node or proxy many clients
	// come through, never takes all of them.
	DefaultShare = 0.5
	// DefaultForwardedHeader is what most proxies add (HAProxy's option
	// forwardfor, nginx's $proxy_add_x_forwarded_for, cloud balancers).
	DefaultForwardedHeader = "X-Forwarded-For"
	// DefaultHoldMaxWait is under the SDKs' 10 s export budget, so that a
	// request held to the end is still answered within it, and long enough
	// that their fixed retries spread over a long Open.
	DefaultHoldMaxWait = 8 * time.Second
	// DefaultHoldMaxRequests bounds what held requests pin (a goroutine and
	// a connection's buffers each) to a few MiB.
	DefaultHoldMaxRequests = 256
)

// The bounds of the settings.
const (
	// minIdleTimeout: TCP's retransmission timeouts start at 1s, so a
	// shorter bound would cut off healthy connections that lost a packet.
	minIdleTimeout = time.Second
	// maxIdleTimeout: a client that sends nothing for longer holds a
	// connection, a goroutine and its head start of the budget for as long;
	// a minute is far beyond any healthy stall.
	maxIdleTimeout = time.Minute
	// maxWaitTimeout bounds how long a body may hold its handler and stop
	// admissions while it waits for the budget.
	maxWaitTimeout = 10 * time.Second
	// minGRPCMaxMessageSize is grpc-go's floor of a stream's flow-control
	// window: a smaller message limit would not bound what a call buffers.
	minGRPCMaxMessageSize = 64 * KiB
	// maxHoldMaxWait bounds how long a held client and a shutdown wait.
	maxHoldMaxWait = 30 * time.Second
	// maxCallWait bounds how long a gRPC call with a deadline waits, in
	// the hold or for its bytes: the client gave it that long, and a
	// shutdown ends every wait first (NotReady), so only a client that
	// asked for it waits long; a JavaScript gRPC exporter, which retries
	// nothing, outlasts a 60 s Open with a 2 minute deadline.
	maxCallWait = 2 * time.Minute
	// maxHoldMaxRequests: each held request keeps a goroutine and its
	// connection's buffers, some 20 to 40 KiB; 4096 of them are already
	// about 150 MiB that no budget sees.
	maxHoldMaxRequests = 4096
	// maxWeight bounds a key's weight: beyond it one key's share dwarfs
	// every other and the floor of a share (one byte) is all the others get.
	maxWeight = 1000
)

// KeySource is what requests are told apart by for their fair shares.
type KeySource string

// The key sources.
const (
	// KeyAddress is the client's address (IPv6 by its /64): the remote
	// address, or the one a trusted proxy forwards.
	KeyAddress KeySource = "address"
	// KeyHeader is a request header (HTTP) or metadata key (gRPC) such as
	// X-Scope-OrgID, nested under the client's address: a client that
	// chooses its own values gains no more than its address's share.
	KeyHeader KeySource = "header"
	// KeyAuth is an attribute of the authenticated client
	// (client.Info.Auth, HTTP only: gRPC authenticates after the message
	// is decoded, so gRPC calls are keyed by their address).
	KeyAuth KeySource = "auth"
)

// Config is the admission section: the budget of in-flight bytes shared by
// every server of an extension, how requests are sized against it, and
// how it is shared between clients.
type Config struct {
	// MaxInflightBytes is the budget of bytes reserved by admitted,
	// unfinished requests: "auto" (a share of the memory limit and of the
	// cores, see InflightBudget.Resolve), 0 = off, or a size such as 24MiB.
	MaxInflightBytes InflightBudget `mapstructure:"max_inflight_bytes"`
	// UnknownSize is what an HTTP body reserves first, once its first byte
	// has arrived, while no size has been learnt for its key and signal.
	UnknownSize ByteSize `mapstructure:"unknown_size"`
	// IdleTimeout bounds how long a request may hold the budget without
	// progress: an HTTP body that receives less than 64 KiB in this long
	// fails with a retryable error, an HTTP body older than it keeps at
	// most 64 KiB reserved beyond what it has received, and a gRPC call
	// that has sent no message within six times as long is cancelled.
	// 0 = off; else between 1s and 1m.
	IdleTimeout time.Duration `mapstructure:"idle_timeout"`
	// WaitTimeout is how long, in total, an admitted HTTP body that
	// outgrows its reservation waits for bytes before it fails (429). A
	// gRPC call waits for most of its deadline instead, unless this is 0
	// (refused at once). At most 10s.
	WaitTimeout time.Duration `mapstructure:"wait_timeout"`
	// GRPCMaxMessageSize is the largest message the gRPC servers decode
	// (the receiver's max_recv_msg_size_mib; grpc-go's 4 MiB when unset):
	// a call reserves at least it, capped at a quarter of the budget, from
	// before its message is read until it has been decoded, since grpc-go
	// decompresses and decodes the whole message before anything can see its
	// size.
	GRPCMaxMessageSize ByteSize `mapstructure:"grpc_max_message_size"`
	// Fairness says how requests are told apart for their shares.
	Fairness FairnessConfig `mapstructure:"fairness"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// FairnessConfig is the fairness section: the key requests are told apart
// by, and the share and weight each key gets of the budget, of the hold's
// places and, under pressure, of the requests admitted.
type FairnessConfig struct {
	// Key is what tells requests apart: address (default), header or auth.
	Key KeySource `mapstructure:"key"`
	// Header is the HTTP header or gRPC metadata key of key: header, for
	// example X-Scope-OrgID.
	Header string `mapstructure:"header"`
	// AuthAttribute is the attribute of the authenticated client of key:
	// auth, for example "subject" (what client.Info.Auth.GetAttribute
	// returns for it).
	AuthAttribute string `mapstructure:"auth_attribute"`
	// TrustedProxies are the addresses or CIDR ranges of proxies whose
	// Forwarded or X-Forwarded-For header names the client's address:
	// from them, the client's address is the last one in the chain that is
	// not itself a trusted proxy. From any other address these headers are
	// ignored.
	TrustedProxies []string `mapstructure:"trusted_proxies"`
	// ForwardedHeader is the header the trusted proxies set the client's
	// address in: X-Forwarded-For (default) or Forwarded (its for=). Only
	// that one is read: a proxy passes the other on as its client sent it,
	// and a client must not choose its own key.
	ForwardedHeader string `mapstructure:"forwarded_header"`
	// Share is the most of the budget and of the hold's places that one
	// key may hold while it is the only one sending; with others active,
	// each has its weighted fair share. In (0, 1]; 1 = no limit.
	Share float64 `mapstructure:"share"`
	// Weights give keys more than one share: a key value (a header value,
	// an auth attribute's value, or with key: address an address or CIDR
	// range) and its weight, in (0, 1000]. Keys not listed weigh 1.
	Weights map[string]float64 `mapstructure:"weights"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// HoldConfig is the hold section: requests the throttle would refuse are
// held, unread, and decided again until they are admitted or have waited
// MaxWait.
type HoldConfig struct {
	// MaxWait is the longest an HTTP request (or a gRPC request without a
	// deadline) is held before it is refused; 0 turns holding off (refuse
	// at once). At most 30s.
	MaxWait time.Duration `mapstructure:"max_wait"`
	// MaxRequests is how many requests are held at once (each costs its
	// goroutine and connection buffers); beyond it a request is refused at
	// once. At most 4096.
	MaxRequests int `mapstructure:"max_requests"`

	// prevent unkeyed literal initialization
	_ struct{}
}

// NewDefaultConfig returns the admission section's defaults.
func NewDefaultConfig() Config {
	return Config{
		MaxInflightBytes:   AutoInflightBudget(),
		UnknownSize:        DefaultUnknownSize,
		IdleTimeout:        DefaultIdleTimeout,
		WaitTimeout:        DefaultWaitTimeout,
		GRPCMaxMessageSize: DefaultGRPCMaxMessageSize,
		Fairness:           FairnessConfig{Key: KeyAddress, Share: DefaultShare, ForwardedHeader: DefaultForwardedHeader},
	}
}

// NewDefaultHoldConfig returns the hold section's defaults.
func NewDefaultHoldConfig() HoldConfig {
	return HoldConfig{MaxWait: DefaultHoldMaxWait, MaxRequests: DefaultHoldMaxRequests}
}

// Errors of Validate, one per invalid setting; the collector prefixes
// the section's path.
var (
	ErrUnknownSizeZero       = errors.New("unknown_size must be > 0 when max_inflight_bytes is not 0")
	ErrUnknownSizeOverBudget = errors.New("unknown_size must be <= max_inflight_bytes")
	ErrIdleTimeout           = fmt.Errorf("idle_timeout must be 0 (off) or between %v and %v", minIdleTimeout, maxIdleTimeout)
	ErrWaitTimeout           = fmt.Errorf("wait_timeout must be between 0s and %v", maxWaitTimeout)
	ErrGRPCMaxMessageSize    = fmt.Errorf("grpc_max_message_size must be between %v and %v", minGRPCMaxMessageSize, MaxByteSize)
	ErrSizeTooLarge          = fmt.Errorf("must be at most %v", MaxByteSize)

	ErrKey            = fmt.Errorf("key must be one of %s, %s, %s", KeyAddress, KeyHeader, KeyAuth)
	ErrHeaderMissing  = errors.New("header must be set with key: header")
	ErrHeaderInvalid  = errors.New("header must be a valid HTTP header name")
	ErrHeaderUnused   = errors.New("header is set but key is not header")
	ErrAuthMissing    = errors.New("auth_attribute must be set with key: auth")
	ErrAuthUnused     = errors.New("auth_attribute is set but key is not auth")
	ErrTrustedProxy   = errors.New("trusted_proxies: want an IP address or a CIDR range")
	ErrForwarded      = errors.New("forwarded_header must be X-Forwarded-For or Forwarded")
	ErrShare          = errors.New("share must be in (0, 1]")
	ErrWeight         = fmt.Errorf("weights: a weight must be in (0, %d]", maxWeight)
	ErrWeightKey      = errors.New("weights: with key: address a key must be an IP address or a CIDR range")
	ErrWeightKeyEmpty = errors.New("weights: a key must not be empty")

	ErrHoldMaxWait     = fmt.Errorf("max_wait must be between 0s and %v", maxHoldMaxWait)
	ErrHoldMaxRequests = fmt.Errorf("max_requests must be between 0 and %d: each held request keeps a goroutine and its connection's buffers", maxHoldMaxRequests)
)

// Validate checks the admission section; Fairness validates itself.
func (c Config) Validate() error {
	var errs []error
	if !c.MaxInflightBytes.IsOff() {
		if c.UnknownSize == 0 {
			errs = append(errs, ErrUnknownSizeZero)
		} else if !c.MaxInflightBytes.IsAuto() && c.UnknownSize > c.MaxInflightBytes.Fixed() {
			errs = append(errs, fmt.Errorf("%w, got %v and %v", ErrUnknownSizeOverBudget, c.UnknownSize, c.MaxInflightBytes.Fixed()))
		}
	}
	if c.IdleTimeout != 0 && (c.IdleTimeout < minIdleTimeout || c.IdleTimeout > maxIdleTimeout) {
		errs = append(errs, fmt.Errorf("%w, got %v", ErrIdleTimeout, c.IdleTimeout))
	}
	if c.WaitTimeout < 0 || c.WaitTimeout > maxWaitTimeout {
		errs = append(errs, fmt.Errorf("%w, got %v", ErrWaitTimeout, c.WaitTimeout))
	}
	if c.GRPCMaxMessageSize < minGRPCMaxMessageSize || c.GRPCMaxMessageSize > MaxByteSize {
		errs = append(errs, fmt.Errorf("%w, got %v", ErrGRPCMaxMessageSize, c.GRPCMaxMessageSize))
	}
	if c.MaxInflightBytes.Fixed() > MaxByteSize {
		errs = append(errs, fmt.Errorf("max_inflight_bytes %w, got %v", ErrSizeTooLarge, c.MaxInflightBytes.Fixed()))
	}
	if c.UnknownSize > MaxByteSize {
		errs = append(errs, fmt.Errorf("unknown_size %w, got %v", ErrSizeTooLarge, c.UnknownSize))
	}
	return errors.Join(errs...)
}

// Validate checks the fairness section.
func (c FairnessConfig) Validate() error {
	var errs []error
	switch c.Key {
	case KeyAddress, KeyHeader, KeyAuth:
	default:
		errs = append(errs, fmt.Errorf("%w, got %q", ErrKey, c.Key))
	}
	switch {
	case c.Key == KeyHeader && c.Header == "":
		errs = append(errs, ErrHeaderMissing)
	case c.Key == KeyHeader && !httpguts.ValidHeaderFieldName(c.Header):
		errs = append(errs, fmt.Errorf("%w, got %q", ErrHeaderInvalid, c.Header))
	case c.Key != KeyHeader && c.Header != "":
		errs = append(errs, ErrHeaderUnused)
	}
	switch {
	case c.Key == KeyAuth && c.AuthAttribute == "":
		errs = append(errs, ErrAuthMissing)
	case c.Key != KeyAuth && c.AuthAttribute != "":
		errs = append(errs, ErrAuthUnused)
	}
	for _, p := range c.TrustedProxies {
		if _, err := parsePrefix(p); err != nil {
			errs = append(errs, fmt.Errorf("%w, got %q", ErrTrustedProxy, p))
		}
	}
	if _, err := forwardedName(c.ForwardedHeader); err != nil {
		errs = append(errs, fmt.Errorf("%w, got %q", err, c.ForwardedHeader))
	}
	if !(c.Share > 0 && c.Share <= 1) { // also rejects NaN
		errs = append(errs, fmt.Errorf("%w, got %s", ErrShare, strconv.FormatFloat(c.Share, 'g', -1, 64)))
	}
	for _, k := range slices.Sorted(maps.Keys(c.Weights)) {
		w := c.Weights[k]
		if !(w > 0 && w <= maxWeight) || math.IsNaN(w) {
			errs = append(errs, fmt.Errorf("%w, got %s for %q", ErrWeight, strconv.FormatFloat(w, 'g', -1, 64), k))
		}
		switch {
		case strings.TrimSpace(k) == "":
			errs = append(errs, ErrWeightKeyEmpty)
		case c.Key == KeyAddress:
			if _, err := parsePrefix(k); err != nil {
				errs = append(errs, fmt.Errorf("%w, got %q", ErrWeightKey, k))
			}
		}
	}
	return errors.Join(errs...)
}

// Validate checks the hold section.
func (c HoldConfig) Validate() error {
	var errs []error
	if c.MaxWait < 0 || c.MaxWait > maxHoldMaxWait {
		errs = append(errs, fmt.Errorf("%w, got %v", ErrHoldMaxWait, c.MaxWait))
	}
	if c.MaxRequests < 0 || c.MaxRequests > maxHoldMaxRequests {
		errs = append(errs, fmt.Errorf("%w, got %d", ErrHoldMaxRequests, c.MaxRequests))
	}
	return errors.Join(errs...)
}

// forwardedName returns the forwarded header name as net/http keys it,
// and whether it is Forwarded (RFC 7239) rather than X-Forwarded-For;
// empty is the default.
func forwardedName(name string) (rfc7239 bool, err error) {
	switch {
	case name == "" || strings.EqualFold(name, DefaultForwardedHeader):
		return false, nil
	case strings.EqualFold(name, "Forwarded"):
		return true, nil
	}
	return false, ErrForwarded
}

// parsePrefix reads an address (a prefix of its full length) or a CIDR
// range, IPv4-mapped IPv6 addresses as IPv4.
func parsePrefix(s string) (netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return netip.Prefix{}, err
		}
		if a := p.Addr(); a.Is4In6() {
			bits := p.Bits() - 96
			if bits < 0 {
				return netip.Prefix{}, fmt.Errorf("prefix %q is wider than the IPv4-mapped range", s)
			}
			p = netip.PrefixFrom(a.Unmap(), bits)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	a = a.Unmap()
	return netip.PrefixFrom(a, a.BitLen()), nil
}
