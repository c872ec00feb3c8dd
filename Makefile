# wasmtools: `make serve` serves the example plugins on stdio; `make test`
# builds every plugin and runs the tests.

GO ?= go

.PHONY: all deps deps-examples build plugins testplugins serve test clean

all: build plugins

# After deps-examples: under make -j, two apt-get runs would race for
# dpkg's lock.
deps: deps-examples
	scripts/deps.sh

# The example plugins need only Go and wat2wasm: serving them asks for no
# more (the tests' servers and the Rust toolchain come with deps).
deps-examples:
	scripts/deps.sh --examples

build:
	$(GO) build -o wasmtools ./cmd/wasmtools

plugins: deps-examples
	scripts/build-plugins.sh examples/plugins examples/plugins/dist

testplugins: deps
	scripts/build-plugins.sh internal/testplugins/src internal/testplugins/dist

serve: build plugins
	./wasmtools serve examples/plugins/dist

# test: vet, every test under the race detector, then the tests whose
# measure the race detector's instrumentation changes (sessions' memory,
# a call's stack: TestSessionsFreeTheirMemory, TestCallStackDepth), without.
# First the plugins are compiled into the tests' shared compilation cache
# without the race detector (scripts/warm-test-cache.sh says why).
# The longest packages' tests first: go test runs them in the order given,
# two at a time on two cores, and sandbox, last of ./... by name, ran
# alone for minutes at the end while the other core idled.
RACE_FIRST = ./host ./cmd/wasmtools ./sandbox ./internal/imagetest ./plugins
test: plugins testplugins
	$(GO) vet ./...
	GO=$(GO) scripts/warm-test-cache.sh
	$(GO) test -race -count=1 -timeout 30m $(RACE_FIRST) ./...
	$(GO) test -count=1 -run 'FreeTheirMemory|CallStackDepth' ./host

clean:
	rm -rf wasmtools examples/plugins/dist internal/testplugins/dist

# bench and bench-short run from bench/, a module of its own so that its
# dependencies (the Extism SDK, gonum's plot) stay out of the main go.mod.
#
# bench: issue 7's benchmarks (package bench), wasmtools against raw wazero,
# the Extism Go SDK, native Go tools and a process per session; rewrites
# docs/BENCHMARKS.md and docs/benchmarks.png. 15 to 20 minutes on 2 cores.
bench: plugins testplugins
	GO=$(GO) bench/run.sh

# bench-short: every benchmark once (20 sessions for memory), the
# benchmarks' baseline check and the report generator's tests, to keep them
# compiling and honest in CI. It writes no figures and asserts no timings.
bench-short: plugins testplugins
	cd bench && $(GO) vet ./...
	cd bench && $(GO) test -short -count=1 -bench . -benchtime 1x ./...

.PHONY: bench bench-short

# faults: the fault suite of durable sessions (internal/faults; docs/DEPLOY.md,
# "Faults"): three replicas, redis-server (a primary, its replica and three
# Sentinels in the redis-failover scenarios), HAProxy and nginx as real
# processes, faults injected while clients of both protocol eras write and
# read, a checker of what they were told. One pass, 3 clients per era: a few
# minutes (CI). FAULTS_SOAK=30m: a soak, 10 clients per era, passes until
# then. FAULTS_RUN=regexp picks scenarios; FAULTS_REPORT=file keeps the table;
# FAULTS_CLIENTS=N runs N clients per era;
# FAULTS_NO_WAIT=1 runs the redis-failover scenarios without wait_replicas
# (redis-failover-silent then loses acknowledged notes: not for CI).
FAULTS_SOAK ?=
# FAULTS_KNOWN: a regexp of scenarios with an open violation, reported but
# not failing the run (docs/DEPLOY.md, "Faults", says which and why):
# redis-empty-mid-drain (a soak's: under load, a 2026-07-28 handle's notes
# lost unsaid, not yet traced; and sessions whose records the store lost
# after a drain released them end, session-lost).
FAULTS_KNOWN ?= ^redis-empty-mid-drain/
faults: plugins testplugins
	FAULTS_KNOWN='$(FAULTS_KNOWN)' FAULTS=$(or $(FAULTS_SOAK),short) $(GO) test -count=1 -timeout $(if $(FAULTS_SOAK),0,30m) -run '^TestFaults$$' -v ./internal/faults

.PHONY: faults
