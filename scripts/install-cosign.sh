#!/usr/bin/env bash
# install-cosign.sh: builds cosign, which the plugin-source and image tests
# sign with, into $(go env GOPATH)/bin, once (see install-go-tool.sh).
# v2.6.5 is the newest v2 that builds with this Go.
exec "$(dirname "$0")/install-go-tool.sh" cosign github.com/sigstore/cosign/v2/cmd/cosign@v2.6.5
