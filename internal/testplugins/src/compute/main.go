//go:build wasip1

// Command compute is a test plugin for the benchmarks (issue 27): ordinary
// Go code that keeps the guest busy, written with the Extism Go PDK and
// speaking the servlet interface (exports describe and call). Its tool
// "crunch" builds n records from a seeded generator, counts words in a
// map, encodes the records as JSON and decodes them back, sorts them,
// hashes the sorted encoding with SHA-256 rounds, and returns a summary
// that depends on every step, so that no contender can skip one.
package main

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/extism/go-pdk"
)

func main() {}

type callInput struct {
	Params struct {
		Name      string `json:"name"`
		Arguments struct {
			N int `json:"n"`
		} `json:"arguments"`
	} `json:"params"`
}

type content struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type result struct {
	Content []content `json:"content"`
}

//go:wasmexport describe
func describe() int32 {
	pdk.OutputString(`{"tools":[{"name":"crunch","description":"Builds, counts, encodes, sorts and hashes n records; returns a summary.","inputSchema":{"type":"object","properties":{"n":{"type":"integer","minimum":1,"maximum":100000}},"required":["n"]}}]}`)
	return 0
}

type record struct {
	ID    int      `json:"id"`
	Name  string   `json:"name"`
	Score float64  `json:"score"`
	Tags  []string `json:"tags"`
}

var words = strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango")

// crunch is the work: every step's result feeds the summary.
func crunch(n int) string {
	rng := mrand.New(mrand.NewPCG(uint64(n), 27))
	recs := make([]record, n)
	counts := map[string]int{}
	for i := range recs {
		tags := make([]string, 1+rng.IntN(4))
		for j := range tags {
			tags[j] = words[rng.IntN(len(words))]
			counts[tags[j]]++
		}
		recs[i] = record{ID: i, Name: words[rng.IntN(len(words))] + "-" + strconv.Itoa(rng.IntN(1000)), Score: rng.Float64() * 100, Tags: tags}
	}
	enc, err := json.Marshal(recs)
	if err != nil {
		return err.Error()
	}
	var back []record
	if err := json.Unmarshal(enc, &back); err != nil {
		return err.Error()
	}
	slices.SortFunc(back, func(a, b record) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return a.ID - b.ID
	})
	sorted, _ := json.Marshal(back)
	sum := sha256.Sum256(sorted)
	for range 64 {
		sum = sha256.Sum256(sum[:])
	}
	top := ""
	for _, w := range words {
		if counts[w] > counts[top] {
			top = w
		}
	}
	return fmt.Sprintf("%d records, %d bytes, first %s, top %s, %s", len(back), len(enc), back[0].Name, top, hex.EncodeToString(sum[:8]))
}

//go:wasmexport call
func call() int32 {
	var in callInput
	if err := json.Unmarshal(pdk.Input(), &in); err != nil {
		pdk.SetError(err)
		return 1
	}
	if in.Params.Name != "crunch" || in.Params.Arguments.N < 1 {
		pdk.SetErrorString("unknown tool, or n < 1")
		return 1
	}
	out, _ := json.Marshal(result{Content: []content{{Type: "text", Text: crunch(in.Params.Arguments.N)}}})
	pdk.Output(out)
	return 0
}
