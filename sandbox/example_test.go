package sandbox_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Compile a plugin once, start an instance, and call one of its exports.
func Example() {
	ctx := context.Background()
	wasm, err := os.ReadFile(testplugins.Root() + "/examples/plugins/dist/counter.wasm")
	if err != nil {
		fmt.Println("run `make plugins` first:", err)
		return
	}
	rt, _ := sandbox.NewRuntime(sandbox.Options{})
	defer rt.Close(ctx)

	policy := sandbox.NewPolicy().WithCallTimeout(5 * time.Second)
	compiled, err := rt.Compile(ctx, wasm, policy)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer compiled.Close(ctx)

	inst, _ := compiled.Instantiate(ctx)
	defer inst.Close(ctx)
	for range 2 {
		out, _ := inst.Call(ctx, "call", []byte(`{"params":{"name":"count"}}`), nil)
		fmt.Println(string(out))
	}
	// Output:
	// {"content":[{"type":"text","text":"1"}]}
	// {"content":[{"type":"text","text":"2"}]}
}
