//go:build wasip1

// Command longtask is an example plugin with a long-running tool that
// reports its progress: `primes` counts the primes below a bound, reporting
// progress as it goes. A client that asks for progress sees it; the call
// can be cancelled at any point, and the host stops the guest.
//
//	GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared -o longtask.wasm .
package main

import (
	"fmt"

	"github.com/wasmtools/wasmtools/abi/guest"
)

func main() {}

func init() {
	guest.Register(guest.Tool{
		Name:        "primes",
		Description: "Counts the primes below a bound, reporting progress in steps.",
		InputSchema: `{"type":"object","properties":{
			"below":{"type":"integer","minimum":2,"maximum":100000000},
			"steps":{"type":"integer","minimum":1,"maximum":1000,"default":10}},
			"required":["below"],"additionalProperties":false}`,
		Annotations: `{"readOnlyHint":true}`,
		Handler:     primes,
	})
}

func primes(c *guest.Call) (*guest.Result, error) {
	var in struct {
		Below int `json:"below"`
		Steps int `json:"steps"`
	}
	if err := c.Bind(&in); err != nil {
		return nil, err
	}
	if in.Steps == 0 {
		in.Steps = 10
	}
	composite := make([]bool, in.Below)
	count := 0
	step := max(in.Below/in.Steps, 1)
	for n := 2; n < in.Below; n++ {
		if !composite[n] {
			count++
			for m := n * n; m < in.Below && m > 0; m += n {
				composite[m] = true
			}
		}
		if n%step == 0 {
			guest.Progress(float64(n), float64(in.Below), fmt.Sprintf("%d primes so far", count))
		}
	}
	guest.Progress(float64(in.Below), float64(in.Below), "done")
	return guest.Text(fmt.Sprintf("%d primes below %d", count, in.Below)), nil
}
