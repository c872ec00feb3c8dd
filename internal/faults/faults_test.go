package faults_test

import (
	"bytes"
	"cmp"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/wasmtools/wasmtools/internal/faults"
	"github.com/wasmtools/wasmtools/internal/testplugins"
)

// TestFaults is the fault suite (docs/DEPLOY.md, "Faults"): every scenario
// of [faults.Scenarios] on a fresh cluster of real processes, checked
// with [faults.Check]. It runs when FAULTS is set (`make faults`):
//
//	FAULTS=short  one pass, 3 clients of each era (CI; a few minutes)
//	FAULTS=30m    a soak: 10 clients of each era, passes until 30 minutes
//	              have gone by
//
// FAULTS_RUN (a regular expression) picks scenarios by "name/proxy";
// FAULTS_KNOWN (a regular expression) names scenarios with a violation
// known and open (docs/DEPLOY.md, "Faults", says which and why): theirs are
// reported as KNOWN in the log and the table, and do not fail the run,
// while every other scenario's do;
// FAULTS_BIN names a wasmtools binary to test (default: built from this
// tree); FAULTS_DEPLOY a folder with other proxy configs (default:
// deploy/); FAULTS_REPORT names a file the summary table is written to;
// FAULTS_LOGS=1 prints the replicas' logs of a failed scenario (and the
// Redis nodes' and sentinels' of a Sentinel one); FAULTS_LOGDIR names a
// folder each scenario writes its replicas' whole logs to, and every
// attempt of each client with a violation (JSON, a line each: the
// timeline a violation is traced from); FAULTS_NO_WAIT=1 runs
// the Sentinel scenarios without wait_replicas, to show what they lose
// without it (not in CI: redis-failover-silent then fails);
// FAULTS_VERBOSE=1 prints each fault as it is injected, =2 also every
// attempt of every client; FAULTS_CLIENTS=N runs N clients of each era in
// place of the mode's 3 or 10 (6 or more: every client role twice, the
// soak's keyless two-plugin clients too).
func TestFaults(t *testing.T) {
	mode := os.Getenv("FAULTS")
	if mode == "" {
		t.Skip("the fault suite runs with FAULTS=short or FAULTS=DURATION (make faults)")
	}
	perEra, passes, soak := 3, 1, time.Duration(0)
	if mode != "short" {
		d, err := time.ParseDuration(mode)
		if err != nil {
			t.Fatalf("FAULTS=%q: short, or a duration: %v", mode, err)
		}
		perEra, passes, soak = 10, 1<<30, d
	}
	if c := os.Getenv("FAULTS_CLIENTS"); c != "" {
		n, err := strconv.Atoi(c)
		if err != nil || n < 1 {
			t.Fatalf("FAULTS_CLIENTS=%q: a number of clients of each era, 1 or more", c)
		}
		perEra = n
	}
	pick := regexp.MustCompile(os.Getenv("FAULTS_RUN"))
	var known *regexp.Regexp
	if k := os.Getenv("FAULTS_KNOWN"); k != "" {
		known = regexp.MustCompile(k)
	}
	setup := faults.Setup{
		Binary:   binary(t),
		NoWait:   os.Getenv("FAULTS_NO_WAIT") != "",
		CacheDir: testplugins.CacheDir(),
		Deploy:   cmp.Or(os.Getenv("FAULTS_DEPLOY"), filepath.Join(testplugins.Root(), "deploy")),
		Plugins: testplugins.Folder(t, map[string]string{
			"notes.wasm":     testplugins.Example(t, "notes"),
			"slownotes.wasm": testplugins.Test(t, "slownotes"),
		}),
	}
	var (
		results []faults.Result
		log     bytes.Buffer
		begin   = time.Now()
	)
	stops := 3
	for pass := 0; pass < passes; pass++ {
		for _, sc := range faults.Scenarios(stops) {
			id := sc.Name + "/" + string(sc.Proxy)
			if !pick.MatchString(id) || sc.SoakOnly && soak == 0 && os.Getenv("FAULTS_RUN") == "" {
				continue
			}
			if soak > 0 && time.Since(begin) > soak {
				break
			}
			name := id
			if soak > 0 {
				name = fmt.Sprintf("%s/pass%d", id, pass+1)
			}
			t.Run(name, func(t *testing.T) {
				var out bytes.Buffer
				res := faults.RunScenario(t, sc, faults.Options{
					Setup: setup, PerEra: perEra, Tag: fmt.Sprintf("p%d", pass),
					Attempt: 5 * time.Second, GiveUp: 60 * time.Second, Steps: 20, Out: &out,
				})
				t.Log("\n" + out.String())
				log.Write(out.Bytes())
				results = append(results, res)
				switch n := len(res.Violations); {
				case n > 0 && known != nil && known.MatchString(id):
					t.Logf("KNOWN OPEN (FAULTS_KNOWN): %s: %d violations: %v", id, n, faults.Counts(res.Violations))
				case n > 0:
					t.Errorf("%s: %d violations: %v", id, n, faults.Counts(res.Violations))
				}
			})
		}
		if soak == 0 || time.Since(begin) > soak {
			break
		}
	}
	var table strings.Builder
	faults.Table(&table, results)
	fmt.Printf("\nfault suite (%s, %v):\n%s", mode, time.Since(begin).Round(time.Second), table.String())
	if path := os.Getenv("FAULTS_REPORT"); path != "" {
		report := fmt.Sprintf("# fault suite, FAULTS=%s, %s, %v\n\n%s\n```\n%s```\n", mode, time.Now().UTC().Format(time.RFC3339), time.Since(begin).Round(time.Second), table.String(), log.String())
		if err := os.WriteFile(path, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// binary returns FAULTS_BIN, or a wasmtools built from this tree.
func binary(t *testing.T) string {
	if b := os.Getenv("FAULTS_BIN"); b != "" {
		return b
	}
	out := filepath.Join(t.TempDir(), "wasmtools")
	cmd := exec.Command("go", "build", "-o", out, "./cmd/wasmtools")
	cmd.Dir = testplugins.Root()
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/wasmtools: %v\n%s", err, b)
	}
	return out
}
