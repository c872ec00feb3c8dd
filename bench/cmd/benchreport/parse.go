package main

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Results are the benchmarks of one run, as `go test -bench` printed them,
// possibly over several invocations and with -count above 1.
type Results struct {
	// CPU is the "cpu:" header line's value, if any.
	CPU string
	// Commands are the "command:" lines, in order: what was run, written
	// into the output by `make bench`.
	Commands []string
	// Names are the benchmark names in order of first appearance, without
	// the "Benchmark" prefix and the -GOMAXPROCS suffix.
	Names []string
	// Samples holds each benchmark's measurements per unit ("ns/op",
	// "KiB/session", …), one per run.
	Samples map[string]map[string][]float64
	// Lines are the command and benchmark result lines as read, for the
	// record: parsed again, they give the same Results (but the CPU).
	Lines []string
}

// procsSuffix is the -GOMAXPROCS suffix go test adds to benchmark names
// when GOMAXPROCS is not 1.
var procsSuffix = regexp.MustCompile(`-\d+$`)

// Parse reads `go test -bench` output. Lines other than results, the cpu
// header and command lines are ignored, so that test logs, PASS/ok lines
// and the output of several invocations can be mixed in. A result line
// that does not parse is an error naming its line number.
func Parse(r io.Reader) (*Results, error) {
	res := &Results{Samples: map[string]map[string][]float64{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimRight(sc.Text(), " \t\r")
		switch {
		case strings.HasPrefix(line, "cpu: "):
			res.CPU = strings.TrimSpace(strings.TrimPrefix(line, "cpu: "))
		case strings.HasPrefix(line, "command: "):
			res.Commands = append(res.Commands, strings.TrimSpace(strings.TrimPrefix(line, "command: ")))
			res.Lines = append(res.Lines, line)
		case strings.HasPrefix(line, "Benchmark"):
			fields := strings.Fields(line)
			if len(fields) < 2 {
				continue // a benchmark's name printed before its log output
			}
			if _, err := strconv.Atoi(fields[1]); err != nil {
				continue // "BenchmarkX   some log text", not a result
			}
			name, metrics, err := parseResult(fields)
			if err != nil {
				return nil, fmt.Errorf("line %d: %v: %q", n, err, line)
			}
			if res.Samples[name] == nil {
				res.Samples[name] = map[string][]float64{}
				res.Names = append(res.Names, name)
			}
			for unit, v := range metrics {
				res.Samples[name][unit] = append(res.Samples[name][unit], v)
			}
			res.Lines = append(res.Lines, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read benchmark output: %w", err)
	}
	return res, nil
}

// parseResult parses the fields of one result line:
// name, iterations, then value-unit pairs.
func parseResult(fields []string) (string, map[string]float64, error) {
	name := procsSuffix.ReplaceAllString(strings.TrimPrefix(fields[0], "Benchmark"), "")
	if len(fields)%2 != 0 {
		return "", nil, fmt.Errorf("benchmark %s: value without a unit", name)
	}
	metrics := map[string]float64{}
	for i := 2; i < len(fields); i += 2 {
		v, err := strconv.ParseFloat(fields[i], 64)
		if err != nil {
			return "", nil, fmt.Errorf("benchmark %s: value %q: %v", name, fields[i], err)
		}
		metrics[fields[i+1]] = v
	}
	return name, metrics, nil
}

// Median returns the median of a benchmark's samples of unit, and whether
// there are any.
func (r *Results) Median(name, unit string) (float64, bool) {
	return median(r.Samples[name][unit])
}

// Spread returns half the range of a benchmark's samples of unit relative
// to their median (0.05 is ±5%), and whether there are any.
func (r *Results) Spread(name, unit string) (float64, bool) {
	s := r.Samples[name][unit]
	m, ok := median(s)
	if !ok || m == 0 {
		return 0, false
	}
	return (slices.Max(s) - slices.Min(s)) / 2 / math.Abs(m), true
}

// Paired returns the median of f over the pairs of name's and base's
// samples of unit taken in the same round (the i-th of each), and whether
// there are any: both have as many samples, which make bench/run.sh's
// rounds pair them. A ratio or a difference between two contenders is
// taken within each round, where both met the same machine, and the median
// taken of those: the ratio of two medians from different rounds mixes the
// machine's drift between them into the figure. With unequal counts the
// samples cannot be paired, and f is applied to the two medians.
func (r *Results) Paired(name, base, unit string, f func(v, b float64) float64) (float64, bool) {
	vs, bs := r.Samples[name][unit], r.Samples[base][unit]
	if len(vs) == 0 || len(bs) == 0 {
		return 0, false
	}
	if len(vs) != len(bs) {
		v, _ := median(vs)
		b, _ := median(bs)
		return f(v, b), true
	}
	xs := make([]float64, len(vs))
	for i := range vs {
		xs[i] = f(vs[i], bs[i])
	}
	return median(xs)
}

// Runs returns how many samples of unit a benchmark has.
func (r *Results) Runs(name, unit string) int { return len(r.Samples[name][unit]) }

func median(s []float64) (float64, bool) {
	if len(s) == 0 {
		return 0, false
	}
	s = slices.Clone(s)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2], true
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2, true
}

// nonzero reports whether a benchmark has samples of unit, none of them 0
// (a ratio's divisor).
func (r *Results) nonzero(name, unit string) bool {
	s := r.Samples[name][unit]
	return len(s) > 0 && !slices.Contains(s, 0)
}
