#!/usr/bin/env bash
# fuzz.sh [TIME]: runs each fuzz target for TIME (default 10s; go test's
# -fuzztime syntax: 10s, 1m), one after another, and fails if any target
# finds a failure. Each run starts with the target's seeds and the crashers
# kept in its package's testdata/fuzz/; a new crasher is written there too.
# See docs/SECURITY.md for what each target checks.
#
# Go 1.26's fuzz coordinator can fail a run that found nothing with a bare
# "context deadline exceeded" at the end of -fuzztime, when a worker is
# slow to stop on a loaded machine (go.dev/issue/75804, fixed in Go 1.27).
# Such a run counts as passed when no crasher was written and the target's
# seeds and kept crashers pass when run again.
#
# Each new interesting input is minimized for at most MINIMIZE executions
# (default 100; go test's own default is 60 s): the run counts no new
# executions while it minimizes, so a short run spent most of its time there
# (FuzzLayer for 10 s in CI: 3 s of fuzzing, then no execution for the
# last 8 while it minimized one input, ending in "context deadline
# exceeded"; for 30 s without minimizing, 9,000 executions a second
# throughout). A crasher is still written, as far as it was minimized.
set -uo pipefail
cd "$(dirname "$0")/.."
time=${1:-${FUZZTIME:-10s}}
GO=${GO:-go}
minimize=${MINIMIZE:-100x}
targets=(
	"./sandbox FuzzKernel"
	"./sandbox FuzzCheckModule"
	"./sandbox FuzzRewrite"
	"./sandbox FuzzInterrupt"
	"./sandbox FuzzSnapshotBody"
	"./sandbox FuzzDecodeS2"
	"./sandbox FuzzSplitCustom"
	"./sandbox FuzzDecodeChecked"
	"./plugins FuzzDecodeOutput"
	"./plugins FuzzCallInput"
	"./plugins FuzzLoadAndCall"
	"./plugins FuzzValidateArguments"
	"./plugins FuzzFlatSchemaAgrees"
	"./host FuzzToMCP"
	"./host FuzzElicitParams"
	"./host FuzzVerifyState"
	"./host FuzzHandles"
	"./internal/jsonobj FuzzCut"
	"./internal/durable FuzzRecord"
	"./internal/sessions FuzzLeases"
	"./internal/statestore FuzzSealOpen"
	"./internal/sources FuzzLayer"
)
out=$(mktemp)
trap 'rm -f "$out"' EXIT
failed=()
for t in "${targets[@]}"; do
	read -r pkg name <<<"$t"
	echo "fuzz: $pkg $name for $time" >&2
	if "$GO" test -run '^$' -fuzz "^$name\$" -fuzztime "$time" -fuzzminimizetime "$minimize" "$pkg" 2>&1 | tee "$out"; then
		continue
	fi
	if grep -qE '^[[:space:]]+context deadline exceeded$' "$out" && ! grep -q 'Failing input written' "$out" &&
		"$GO" test -count=1 -run "^$name\$" "$pkg" >/dev/null 2>&1; then
		echo "fuzz: $pkg $name: the run ended in go.dev/issue/75804, with no crasher: passed" >&2
		continue
	fi
	failed+=("$pkg $name")
done
if [ ${#failed[@]} -gt 0 ]; then
	printf 'fuzz: failed: %s\n' "${failed[@]}" >&2
	exit 1
fi
