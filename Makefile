# wasmtools: `make serve` serves the example plugins on stdio; `make test`
# builds every plugin and runs the tests.

GO ?= go

.PHONY: all deps build plugins testplugins serve test clean

all: build plugins

deps:
	scripts/deps.sh

build:
	$(GO) build -o wasmtools ./cmd/wasmtools

plugins: deps
	scripts/build-plugins.sh examples/plugins examples/plugins/dist

testplugins: deps
	scripts/build-plugins.sh internal/testplugins/src internal/testplugins/dist

serve: build plugins
	./wasmtools serve examples/plugins/dist

test: plugins testplugins
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	$(GO) test -count=1 -run 'FreeTheirMemory' ./host

clean:
	rm -rf wasmtools examples/plugins/dist internal/testplugins/dist
