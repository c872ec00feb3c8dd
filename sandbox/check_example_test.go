package sandbox_test

import (
	"errors"
	"fmt"
	"os"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Check a module against the default limits, and against a lower one.
func ExampleCheckModule() {
	wasm, err := os.ReadFile(testplugins.Root() + "/examples/plugins/dist/counter.wasm")
	if err != nil {
		fmt.Println("run `make plugins` first:", err)
		return
	}
	stats, err := sandbox.CheckModule(wasm, sandbox.ModuleLimits{})
	fmt.Println(stats.Functions, stats.MaxNesting, err)

	_, err = sandbox.CheckModule(wasm, sandbox.ModuleLimits{MaxFunctionSize: 100})
	var le *sandbox.LimitError
	if errors.As(err, &le) {
		fmt.Println(le.Limit, le.Value)
	}
	fmt.Println(err)
	// Output:
	// 6 2 <nil>
	// max_function_size 124
	// section 10: function 5 size in bytes: 124 is over the limit max_function_size = 100
}
