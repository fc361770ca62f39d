# throttle: adaptive overload protection for the OpenTelemetry Collector.
SHELL := /bin/bash
GO ?= go
# make test runs without the race detector and without go test's vet
# checks (make lint runs go vet), to stay quick on a small machine; make
# e2e runs every test under the race detector, with a longer bound because
# its load tests wait for one another across packages.
GOTEST_FLAGS ?= -vet=off -timeout 10m
E2E_FLAGS ?= -race -timeout 20m
MDATAGEN := $(GO) tool -modfile=$(CURDIR)/internal/tools/go.mod mdatagen

# Two modules: the component module (the repository root: the processor, the
# extension and their internal packages) and testbed/ (benchmarks, load
# generator, end-to-end tests with real exporters and the distribution
# tests), which keeps plotting, otelcol and the exporters out of the
# component's go.mod. internal/tools is a third, for the pinned tools only.
TESTBED := testbed

.PHONY: all
all: lint test

## test: the unit and component tests: the component module (go test ./...
## at the root) and the docs checks (testbed/test/docs). Nothing in it needs
## root, cgroups, a browser, a distribution build, load or npm; the rest
## carries the build tag e2e and runs in make e2e.
.PHONY: test
test:
	$(GO) test $(GOTEST_FLAGS) ./...
	cd $(TESTBED) && $(GO) test $(GOTEST_FLAGS) ./test/docs/

## e2e: every test of both modules under the race detector, with the
## end-to-end ones (build tag e2e; Linux, as root): real cgroups, the status
## page in headless Chromium, the distribution built with ocb and its smoke
## tests, the benchmarks' short forms in cgroups (one at a time, about 11
## minutes), HAProxy, the JavaScript SDK, real exporters. It installs the
## JavaScript clients' packages (npm ci) and ocb itself; a missing root,
## chromium, haproxy or node skips what needs it, said on one line each,
## and fails instead under CI=true. The testbed's packages run one at a
## time (-p 1): a package's CPU-heavy tests beside a load test in a cgroup
## of a tenth of a CPU made the tier and autoscaling tests miss their
## targets.
.PHONY: e2e
e2e: e2e-tools
	$(GO) test $(E2E_FLAGS) -tags e2e ./...
	cd $(TESTBED) && $(GO) test $(E2E_FLAGS) -p 1 -tags e2e ./...

# e2e-tools: what the end-to-end tests need besides Go, checked before they
# run, since go test shows no skip without -v; with node and npm, the
# JavaScript clients' packages are installed first (clients-js).
.PHONY: e2e-tools
e2e-tools: $(if $(shell command -v node && command -v npm),clients-js)
	@ci=; case "$${CI:-}" in ""|false|0) ;; *) ci=1 ;; esac; bad=0; \
	skipping() { if [ -n "$$ci" ]; then echo "e2e: $$1 cannot run: $$2 (CI is set: nothing may be skipped)" >&2; bad=1; \
	  else echo "e2e: skipping $$1: $$2"; fi; }; \
	[ "$$(id -u)" = 0 ] || skipping "the load tests in cgroups and the cgroup test" "not root (run make e2e as root)"; \
	{ [ -n "$${THROTTLE_CHROMIUM:-}" ] || command -v chromium || command -v chromium-browser \
	  || command -v google-chrome || command -v google-chrome-stable; } >/dev/null \
	  || skipping "the status page's browser test" "no chromium (apt-get install chromium fonts-dejavu-core, or set THROTTLE_CHROMIUM)"; \
	{ command -v haproxy || [ -x /usr/sbin/haproxy ]; } >/dev/null \
	  || skipping "the tier, autoscaling and balancer tests" "no haproxy (apt-get install haproxy)"; \
	{ command -v node && command -v npm; } >/dev/null \
	  || skipping "the client matrix's short form" "no node and npm (install Node.js)"; \
	exit $$bad

## bench: run the Go benchmarks (request path, engine, sampler; both modules).
.PHONY: bench
bench:
	$(GO) test -run='^$$' -bench=. -benchmem -cpu 1,2 ./...
	cd $(TESTBED) && $(GO) test -run='^$$' -bench=. -benchmem -cpu 1,2 ./...

## fuzz: run every fuzz target for FUZZTIME each: a duration (10s) or a count of inputs (20000x).
# Seeds are in testdata/fuzz.
FUZZTIME ?= 10s
FUZZ_TARGETS := \
	./internal/cgroup:FuzzParseMountinfo ./internal/cgroup:FuzzParseProcCgroup \
	./internal/cgroup:FuzzParseCPUMax ./internal/cgroup:FuzzParseCPUSet \
	./internal/cgroup:FuzzParseMemoryStat ./internal/cgroup:FuzzParseProcStat \
	./internal/middleware:FuzzClassifyHTTP ./extension/throttleextension:FuzzConfigUnmarshal
.PHONY: fuzz
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  echo "fuzz $${t#*:} ($(FUZZTIME))"; \
	  $(GO) test -run='^$$' -fuzz="^$${t#*:}$$" -fuzztime=$(FUZZTIME) $${t%%:*}; \
	done

## lint: gofmt, go vet and golangci-lint (.golangci.yml; the version is pinned
## in internal/tools/go.mod, like mdatagen), in both modules, the files of
## the e2e and soak build tags included (as .golangci.yml's build-tags).
GOLANGCI_LINT := $(GO) tool -modfile=$(CURDIR)/internal/tools/go.mod golangci-lint
.PHONY: lint
lint:
	@bad=$$(gofmt -l $$(find . -name '*.go' -not -path './_build/*' -not -path './bin/*')); if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet -tags e2e,soak ./...
	$(GOLANGCI_LINT) run ./...
	cd $(TESTBED) && $(GO) vet -tags e2e,soak ./...
	cd $(TESTBED) && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...
	$(MAKE) --no-print-directory links

## links: fail on a dead relative link in the repository's tracked Markdown
## (a file not tracked, an anchor no heading has; testbed/test/mdlinks).
.PHONY: links
links:
	cd $(TESTBED) && $(GO) test -count=1 -run '^TestRepositoryLinks$$' ./test/mdlinks/

## generate: regenerate mdatagen output for the processor (root) and the extension.
# mdatagen names the package of its generated tests after the folder holding
# metadata.yaml, so the root is generated through a symlink named after the
# package, whatever this checkout's folder is called.
.PHONY: generate
generate:
	@tmp=$$(mktemp -d) && ln -s $(CURDIR) $$tmp/throttleprocessor && \
	  (cd $$tmp/throttleprocessor && $(MDATAGEN) metadata.yaml) ; rc=$$?; rm -rf $$tmp; exit $$rc
	cd extension/throttleextension && $(MDATAGEN) metadata.yaml

## check-generate: fail when the committed generated files differ from `make generate`.
.PHONY: check-generate
check-generate: generate
	@git diff --exit-code -- '*generated*' '*documentation.md' || { echo "generated files are stale: run make generate"; exit 1; }

## status-page-png: render docs/status-page.png from the real page over the browser test's
## simulated burst, with the default lines (headless Chromium).
.PHONY: status-page-png
status-page-png:
	THROTTLE_WRITE_SCREENSHOT=$(CURDIR)/docs/status-page.png $(GO) test -tags e2e -count=1 -run 'TestPageInChromium/screenshot' ./internal/statuspage

# ---------------------------------------------------------------------------
# The distributions: otelcol-throttle (builder-config.yaml), and the fleet
# benchmark's peers otelcol-stock and otelcol-mlext (testbed/bench/fleet), all
# built with ocb by testbed/internal/distbuild as the tests build them (the
# ocb release per manifest, installed and cached by a hash of the sources
# under the user's cache folder) and copied into ./_build. The targets always
# ask distbuild, which rebuilds only what changed.

DISTBUILD := $(GO) run -C $(TESTBED) ./cmd/distbuild
OTELCOL := $(CURDIR)/_build/otelcol-throttle
OTELCOL_STOCK := $(CURDIR)/_build/stock/otelcol-stock
OTELCOL_MLEXT := $(CURDIR)/_build/mlext/otelcol-mlext
CONFIG ?= examples/otelcol-config.yaml

.PHONY: distbuild-always
$(OTELCOL) $(OTELCOL_STOCK) $(OTELCOL_MLEXT): distbuild-always
	$(DISTBUILD) -o $@ $(notdir $@)

## otelcol: build the otelcol-throttle distribution into ./_build (installs ocb if missing).
.PHONY: otelcol
otelcol: $(OTELCOL)

## run: build the distribution if needed and run it with $(CONFIG)
## (OTLP on localhost:4317/4318, its own metrics on localhost:8888/metrics).
.PHONY: run
run: $(OTELCOL)
	$(OTELCOL) --config $(CONFIG)

## smoke: only the smoke test of the real distribution (part of `make e2e` too).
.PHONY: smoke
smoke:
	cd $(TESTBED) && $(GO) test -tags e2e -count=1 -v -timeout 20m ./test/distribution/...

# The benchmark drivers are built from the testbed module into ./bin and run
# from the repository root, where their default paths (_build/...,
# bench/runs/...) and the paths of the README's commands are. A run goes to
# bench/runs/<date>-<name> (git-ignored); make promote makes one the
# baseline in bench/results.
.PHONY: bench-bin
## bench-bin: build bin/overload, bin/fleet, bin/tenants and bin/loadgen from the testbed module.
bench-bin:
	$(GO) build -C $(TESTBED) -o $(CURDIR)/bin/ ./bench/overload ./bench/fleet ./bench/tenants ./cmd/loadgen

## overload: the overload benchmark (Linux, root): builds the distribution, then
## runs it in a 1 CPU / 300 MiB cgroup under scenarios A B C D M (testbed/bench/overload).
## Without -rate-over it first finds A's saturation point. Results in bench/runs/.
## e.g. make overload OVERLOAD_FLAGS='-d 90s -rate-over 1800 -c-below 8'
OVERLOAD_FLAGS ?=
.PHONY: overload
overload: $(OTELCOL) bench-bin
	$(CURDIR)/bin/overload -collector $(OTELCOL) $(OVERLOAD_FLAGS)

## soak: a long run (Linux, root; not part of `make e2e`): the
## distribution with throttle in a 1 CPU / 300 MiB cgroup at twice its
## saturating load for 10 minutes (testbed/bench/overload/soak_test.go, build
## tag soak). Shorter: make soak SOAK_FLAGS='-soak.duration=2m'; results in bench/runs/.
SOAK_FLAGS ?=
SOAK_TIMEOUT ?= 40m
.PHONY: soak
soak: $(OTELCOL)
	cd $(TESTBED) && OTELCOL_THROTTLE_BINARY=$(OTELCOL) $(GO) test -tags soak -run '^TestSoak$$' -count=1 -v -timeout $(SOAK_TIMEOUT) ./bench/overload -args $(SOAK_FLAGS)

## receivers: the processor behind the kafka, filelog and prometheus receivers
## through an Open (testbed/test/receivers, build tag e2e; about 1.5 minutes,
## not part of `make test`); docs/processor.md has the recipes and figures.
## Shorter Open: make receivers RECEIVERS_FLAGS='-receivers.open=10s'.
RECEIVERS_FLAGS ?=
.PHONY: receivers
receivers:
	cd $(TESTBED) && $(GO) test -tags e2e -count=1 -v ./test/receivers/ -args $(RECEIVERS_FLAGS)

# ---------------------------------------------------------------------------
# The fleet benchmark (testbed/bench/fleet): stock collectors as agents and
# sink, the gateway under test in a cgroup. Peers are built from manifests in
# testbed/bench/fleet: otelcol-stock (no throttle code, this collector release) and
# otelcol-mlext (core's memory_limiter extension, only served up to v0.159.0,
# so built with that release's ocb).

## otelcol-stock, otelcol-mlext: build the fleet benchmark's peer distributions.
.PHONY: otelcol-stock otelcol-mlext
otelcol-stock: $(OTELCOL_STOCK)
otelcol-mlext: $(OTELCOL_MLEXT)

## fleet: the fleet benchmark (Linux, root; about 40 minutes): capacity of a
## 0.3 CPU / 150 MiB gateway, then a 60 s burst at twice that through four
## stock agents and the drain, for every gateway scenario. Results in
## bench/runs/. e.g. make fleet FLEET_FLAGS='-protocol grpc'
FLEET_FLAGS ?=
.PHONY: fleet
fleet: $(OTELCOL) $(OTELCOL_STOCK) $(OTELCOL_MLEXT) bench-bin
	$(CURDIR)/bin/fleet -throttle $(OTELCOL) -stock $(OTELCOL_STOCK) -mlext $(OTELCOL_MLEXT) $(FLEET_FLAGS)

## promote: make one run the baseline of its benchmark: RUN=bench/runs/<dir>
## BENCH=<overload-sweep|fleet-http|fleet-grpc|fleet-hung-http|fleet-hung-grpc|fleet-slow-http|fleet-slow-grpc|soak|clients-a..f|clients-e-throttle|clients-e-stock|clients-f-throttle|clients-f-stock|hostile|tier-http|tier-grpc|autoscale-http|tenants>, and
## CHARTS=a.png,b.png when the run has more than three charts. Replaces
## bench/results/$(BENCH)/ with the run's report, summary and charts and
## updates its row of bench/results/README.md (testbed/bench/promote).
RUN ?=
BENCH ?=
CHARTS ?=
.PHONY: promote
promote:
	@test -n "$(RUN)" -a -n "$(BENCH)" || { echo "usage: make promote RUN=bench/runs/<dir> BENCH=<baseline> [CHARTS=a.png,b.png]"; exit 2; }
	$(GO) run -C $(TESTBED) ./bench/promote -run $(abspath $(RUN)) -bench $(BENCH) -results $(CURDIR)/bench/results -charts '$(CHARTS)'

# ---------------------------------------------------------------------------
# The client matrix (testbed/bench/clients): real OTLP clients (the
# Go and JavaScript SDKs' exporters, stock collector agents) with their
# defaults against the distribution, every span counted at the sink. Its
# JavaScript clients' packages are pinned by its package-lock.json.

CLIENTS_JS := $(TESTBED)/bench/clients/js

$(CLIENTS_JS)/node_modules/.package-lock.json: $(CLIENTS_JS)/package-lock.json
	cd $(CLIENTS_JS) && npm ci --ignore-scripts --no-audit --no-fund

## clients-js: install the client matrix's JavaScript packages (npm ci).
.PHONY: clients-js
clients-js: $(CLIENTS_JS)/node_modules/.package-lock.json

## clients: the client matrix (Linux, root; about 30 minutes for every
## scenario): short Opens, a 60 s Open, 5 minutes at twice the capacity, large
## gzip bodies, a hung and a slow backend (each with and without the
## downstream level, and the stock collector). Results in
## bench/runs/<date>-clients-<scenario>/.
## e.g. make clients CLIENTS_FLAGS='-scenario a'
CLIENTS_FLAGS ?=
.PHONY: clients
clients: $(OTELCOL) $(OTELCOL_STOCK) clients-js
	$(GO) build -C $(TESTBED) -o $(CURDIR)/bin/ ./bench/clients
	$(CURDIR)/bin/clients -throttle $(OTELCOL) -stock $(OTELCOL_STOCK) $(CLIENTS_FLAGS)

# ---------------------------------------------------------------------------
## tenants: fairness per tenant (Linux, root, haproxy; about 25 minutes):
## ten stock agents sending their tenant in a header, one at ten times the
## others' rate, behind HAProxy in HTTP mode and without a proxy, against
## the throttle keyed by address, by the tenant header and by the
## forwarded address, a stock gateway and core's memory_limiter extension,
## each gateway in a baseline round without the noisy tenant and a round
## with it (testbed/bench/tenants). The binaries are the defaults' paths,
## relative to the repository root, as the run records its command. Results
## in bench/runs/<date>-tenants/ (git-ignored).
## e.g. make tenants TENANTS_FLAGS='-topologies proxy -gateways throttle-tenant,throttle-address -round 20s'
TENANTS_FLAGS ?=
.PHONY: tenants
tenants: $(OTELCOL) $(OTELCOL_STOCK) $(OTELCOL_MLEXT) bench-bin
	$(CURDIR)/bin/tenants $(TENANTS_FLAGS)

# ---------------------------------------------------------------------------
## hostile: one hostile peer at a time beside normal clients (Linux, root;
## about 30 minutes): the distribution with the shipped defaults in a
## 1 CPU / 512 MiB cgroup, normal clients at half its capacity, each
## scenario after a baseline round (testbed/bench/hostile).
## Results in bench/runs/<date>-hostile/ (git-ignored).
## e.g. make hostile HOSTILE_FLAGS='-scenarios fill-then-trickle -d 20s'
HOSTILE_FLAGS ?=
.PHONY: hostile
hostile: $(OTELCOL)
	$(GO) build -C $(TESTBED) -o $(CURDIR)/bin/ ./bench/hostile
	$(CURDIR)/bin/hostile -collector $(OTELCOL) $(HOSTILE_FLAGS)

## tier: the tier benchmark (Linux, root, haproxy; about 20 minutes over
## HTTP, 40 over gRPC): the capacity of the largest replica size (the others' scaled
## by their CPU), then, round by round, a
## replica set of the stock gateway, memory_limiter and throttle (0.2, 0.2
## and 0.1 CPU, 150 MiB each) behind HAProxy (TCP, round-robin) through a
## 60 s burst at 1x and 1.5x the summed capacity and the drain
## (testbed/bench/fleet, -tier). Results in bench/runs/<date>-tier-<protocol>.
## e.g. make tier TIER_FLAGS='-protocol grpc -scenarios stock,throttle,throttle+age=30s'
TIER_FLAGS ?=
.PHONY: tier
tier: $(OTELCOL) $(OTELCOL_STOCK) bench-bin
	$(CURDIR)/bin/fleet -tier 3 -throttle $(OTELCOL) -stock $(OTELCOL_STOCK) $(TIER_FLAGS)

## autoscale: the autoscaling replay (Linux, root, haproxy; about 25 minutes
## over HTTP, 45 over gRPC): Kubernetes' HPA replayed on CPU and on
## otelcol_throttle_demand against a tier of up to three throttle replicas
## (0.2 CPU, 150 MiB each) from one ready, under 2.5 replicas' capacity for
## 2 minutes, three rounds (testbed/bench/fleet, -tier -autoscale). Results
## in bench/runs/<date>-autoscale-<protocol>.
## e.g. make autoscale AUTOSCALE_FLAGS='-protocol grpc -rounds 2'
AUTOSCALE_FLAGS ?=
.PHONY: autoscale
autoscale: $(OTELCOL) $(OTELCOL_STOCK) bench-bin
	$(CURDIR)/bin/fleet -tier 3 -autoscale cpu,demand -throttle $(OTELCOL) -stock $(OTELCOL_STOCK) $(AUTOSCALE_FLAGS)
