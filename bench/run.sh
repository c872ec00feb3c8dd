#!/usr/bin/env bash
# run.sh is `make bench`: it runs the benchmarks of package bench (issue 7)
# and writes docs/BENCHMARKS.md and docs/benchmarks.png from their output.
# The plugins must be built (`make plugins testplugins`). About 6 to 11
# minutes on 2 cores, most of it in the timed benchmarks (-count 5) and in
# holding 1,000 sessions per memory contender (-count 3).
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# run prints the go test command into the output, for the report's "how to
# reproduce", then runs it.
run() {
	local cmd="command: go test" a
	for a in "$@"; do
		case $a in
		*[!A-Za-z0-9_./=-]*) cmd+=" '$a'" ;;
		*) cmd+=" $a" ;;
		esac
	done
	echo "$cmd" | tee -a "$out"
	"$GO" test "$@" 2>&1 | tee -a "$out"
}

start=$(date +%s)
# bench is a module of its own (bench/go.mod): -C bench runs in it.
run -C bench -run XXX -bench 'SessionStart|WarmCall|ConcurrentSessions|Compile|ReloadLatency|ComputeCall|TracedCall' -benchtime 500ms -count 5 .
run -C bench -run XXX -bench 'IdleSessionMemory' -benchtime 1x -count 3 .
# DurableCall starts a redis-server (Debian package redis-server, see
# scripts/deps.sh); without one it is skipped and section 12 is empty.
run -C bench -run XXX -bench 'DurableCall' -benchtime 500ms -count 5 .
run -run XXX -bench 'NewInstanceFirstCall|InstanceWarmCall|HandleOverhead|Snapshot' -benchtime 500ms -count 5 ./sandbox ./host
run -run XXX -bench 'IdleInstanceMemory' -benchtime 1x -count 3 ./sandbox
"$GO" run -C bench ./cmd/benchreport -md "$PWD/docs/BENCHMARKS.md" -png "$PWD/docs/benchmarks.png" "$out"
echo "bench: wrote docs/BENCHMARKS.md and docs/benchmarks.png in $(($(date +%s) - start)) s" >&2
