#!/usr/bin/env bash
# Runs every package's tests under the race detector in two `go test`
# processes at once, each a package at a time, split so that the halves
# take about as long: host alone is some 40% of the time, and with -p 2
# over ./... the last long package (sandbox) started late and ran alone
# for minutes while the other core idled.
set -uo pipefail
GO=${GO:-go}
first=(./host ./plugins ./internal/imagetest)
mapfile -t rest < <("$GO" list ./... | grep -v -x -e '.*/host' -e '.*/plugins' -e '.*/internal/imagetest')
"$GO" test -race -count=1 -timeout 30m -p 1 "${first[@]}" &
a=$!
"$GO" test -race -count=1 -timeout 30m -p 1 "${rest[@]}" &
b=$!
rc=0
wait "$a" || rc=1
wait "$b" || rc=1
exit "$rc"
