#!/usr/bin/env bash
# run.sh is `make bench`: it runs the benchmarks of package bench (issue 7)
# and writes docs/BENCHMARKS.md and docs/benchmarks.png from their output.
# The plugins must be built (`make plugins testplugins`). About 15 to 20
# minutes on 2 cores, most of it in the timed benchmarks and in holding
# 1,000 sessions per memory contender (-count 3).
#
# The timed benchmarks run in rounds: each test binary is built once, and
# every round runs each of them once (-count 1), ROUNDS times in turn, so
# that in every round a contender and its baseline are measured seconds
# apart, one after the other, rather than each in a window of its own.
# go test's -count N runs a benchmark's N runs back to back, so a slow
# minute on a shared machine lands on one contender and moves a ratio by
# as much as the goal it is checked against; across rounds it lands on
# both.
set -euo pipefail
cd "$(dirname "$0")/.."
GO=${GO:-go}
ROUNDS=${ROUNDS:-5}
out=$(mktemp)
bin=$(mktemp -d)
trap 'rm -rf "$out" "$bin"' EXIT

# note writes the command a run stands for into the output, for the
# report's "how to reproduce".
note() {
	local cmd="command: go test" a
	for a in "$@"; do
		case $a in
		*[!A-Za-z0-9_./=-]*) cmd+=" '$a'" ;;
		*) cmd+=" $a" ;;
		esac
	done
	echo "$cmd" | tee -a "$out"
}

# run notes a go test command, then runs it.
run() {
	note "$@"
	"$GO" test "$@" 2>&1 | tee -a "$out"
}

# timed DIR BIN BENCH runs test binary BIN's benchmarks BENCH once, in
# package directory DIR, as go test would.
timed() {
	(cd "$1" && "$bin/$2" -test.run XXX -test.bench "$3" -test.benchtime 500ms -test.count 1) 2>&1 | tee -a "$out"
}

start=$(date +%s)
# bench is a module of its own (bench/go.mod): -C bench builds in it.
"$GO" test -C bench -c -o "$bin/bench.test" .
"$GO" test -c -o "$bin/sandbox.test" ./sandbox
"$GO" test -c -o "$bin/host.test" ./host
main='SessionStart|WarmCall|ConcurrentSessions|Compile|ReloadLatency|ComputeCall|TracedCall'
# DurableCall starts a redis-server (Debian package redis-server, see
# scripts/deps.sh); without one it is skipped and section 12 is empty.
durable='DurableCall'
inst='NewInstanceFirstCall|InstanceWarmCall|HandleOverhead|Snapshot'
note -C bench -run XXX -bench "$main" -benchtime 500ms -count 1 .
note -C bench -run XXX -bench "$durable" -benchtime 500ms -count 1 .
note -run XXX -bench "$inst" -benchtime 500ms -count 1 ./sandbox ./host
echo "command: # the 3 commands above run $ROUNDS times in turn, one round after another" | tee -a "$out"
for ((r = 1; r <= ROUNDS; r++)); do
	echo "bench: round $r of $ROUNDS" >&2
	timed bench bench.test "$main"
	timed bench bench.test "$durable"
	timed sandbox sandbox.test "$inst"
	timed host host.test "$inst"
done
run -C bench -run XXX -bench 'IdleSessionMemory' -benchtime 1x -count 3 .
run -run XXX -bench 'IdleInstanceMemory' -benchtime 1x -count 3 ./sandbox
"$GO" run -C bench ./cmd/benchreport -md "$PWD/docs/BENCHMARKS.md" -png "$PWD/docs/benchmarks.png" "$out"
echo "bench: wrote docs/BENCHMARKS.md and docs/benchmarks.png in $(($(date +%s) - start)) s" >&2
