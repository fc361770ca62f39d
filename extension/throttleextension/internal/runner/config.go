// Copyright The throttle Authors
// SPDX-License-Identifier: Apache-2.0

package runner // import "github.com/otelthrottle/throttle/extension/throttleextension/internal/runner"

import (
	"time"

	"go.opentelemetry.io/collector/config/confighttp"

	"github.com/otelthrottle/throttle/internal/admission"
	"github.com/otelthrottle/throttle/internal/decision"
	"github.com/otelthrottle/throttle/internal/middleware"
	"github.com/otelthrottle/throttle/internal/sampler"
	"github.com/otelthrottle/throttle/internal/softlimit"
)

// Config is the runner's configuration: the extension's validated Config,
// resolved into what each part of the machinery takes. The extension's
// Config stays what users write; this one has no defaults of its own.
type Config struct {
	// Enabled false starts nothing: every decision admits.
	Enabled bool
	// ObserveOnly counts decisions but admits every request.
	ObserveOnly bool
	// Sampler is the sampler's configuration; its Interval is the sample
	// interval of every other part (stale watchdog, status page).
	Sampler sampler.Config
	// Decision is the engine's configuration: the thresholds and every
	// signal's rule, resolved over the default rule.
	Decision decision.Config
	// Routes classify requests by HTTP path and gRPC method.
	Routes middleware.Routes
	// RetryAfterMin and RetryAfterMax bound the delay a rejected client is
	// asked to wait.
	RetryAfterMin, RetryAfterMax time.Duration
	// TarpitDelay and TarpitMaxRequests configure the HTTP tarpit (0: off).
	TarpitDelay       time.Duration
	TarpitMaxRequests int
	// Hold configures the hold (0: off).
	Hold admission.HoldConfig
	// Admission configures the admission budget and its fairness.
	Admission  admission.Config
	GoMemLimit softlimit.Config
	// StaleAfter is how old the water level may get before decisions fall
	// back to admitting (0: hold the last level).
	StaleAfter time.Duration
	// Status is the status page's server; nil when the page is off.
	Status *confighttp.ServerConfig
	// ReportStatus reports Open as a recoverable error to the host.
	ReportStatus bool
	// Effective is the extension's configuration as loaded (defaults
	// filled in), which the status page shows: it is marshalled through
	// confmap, so its keys are the mapstructure tags. Nil shows none.
	Effective any
}
