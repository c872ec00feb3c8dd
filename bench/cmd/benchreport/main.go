// Command benchreport turns the output of the wasmtools benchmarks (package
// bench, `go test -bench`, any -count) into docs/BENCHMARKS.md: medians per
// benchmark, ratios to the baselines measured in the same run, the machine,
// Go version and date, how to reproduce it, and a chart (docs/benchmarks.png)
// of session-start cost and memory per session against the alternatives.
//
//	cd bench # a module of its own
//	go test -run XXX -bench . -count 5 . | tee out.txt
//	go run ./cmd/benchreport -md ../docs/BENCHMARKS.md -png ../docs/benchmarks.png out.txt
//
// With no file argument it reads standard input. `make bench` does all of
// this.
package main

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}

func run(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	fs.SetOutput(stderr)
	md := fs.String("md", "docs/BENCHMARKS.md", "Markdown report to write (\"-\": standard output)")
	png := fs.String("png", "docs/benchmarks.png", "chart to write, linked from the report (\"\": none)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	in := stdin
	switch fs.NArg() {
	case 0:
	case 1:
		f, err := os.Open(fs.Arg(0))
		if err != nil {
			fmt.Fprintln(stderr, "benchreport:", err)
			return 1
		}
		defer f.Close()
		in = f
	default:
		fmt.Fprintln(stderr, "usage: benchreport [-md FILE] [-png FILE] [BENCH-OUTPUT]")
		return 2
	}
	res, err := Parse(in)
	if err != nil {
		fmt.Fprintln(stderr, "benchreport:", err)
		return 1
	}
	if len(res.Names) == 0 {
		fmt.Fprintln(stderr, "benchreport: no benchmark results in the input")
		return 1
	}
	link := ""
	if *png != "" {
		var buf bytes.Buffer
		if err := Chart(res, &buf); err != nil {
			fmt.Fprintln(stderr, "benchreport:", err)
			return 1
		}
		if err := os.WriteFile(*png, buf.Bytes(), 0o644); err != nil {
			fmt.Fprintln(stderr, "benchreport:", err)
			return 1
		}
		link = filepath.Base(*png)
		if *md != "-" {
			if rel, err := filepath.Rel(filepath.Dir(*md), *png); err == nil {
				link = filepath.ToSlash(rel)
			}
		}
	}
	env := Env{Machine: machine(res.CPU), GoVersion: runtime.Version(), Date: time.Now().UTC().Format("2006-01-02")}
	out := Markdown(res, env, link)
	if *md == "-" {
		_, err = io.WriteString(stdout, out)
	} else {
		err = os.WriteFile(*md, []byte(out), 0o644)
	}
	if err != nil {
		fmt.Fprintln(stderr, "benchreport:", err)
		return 1
	}
	return 0
}

// machine describes this machine: the CPU model from /proc/cpuinfo (or the
// benchmark output's cpu line), the number of CPUs the Go runtime sees, the
// memory from /proc/meminfo, and the OS.
func machine(cpu string) string {
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
	}
	s := fmt.Sprintf("%s, %d CPUs (nproc)", cmp.Or(cpu, "unknown CPU"), runtime.NumCPU())
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		for line := range strings.SplitSeq(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
				var kb int64
				if _, err := fmt.Sscan(v, &kb); err == nil {
					s += fmt.Sprintf(", %.0f GiB memory", float64(kb)/(1<<20))
				}
			}
		}
	}
	return s + ", " + runtime.GOOS + "/" + runtime.GOARCH
}
