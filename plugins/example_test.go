package plugins_test

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/wasmtools/wasmtools/internal/testplugins"
	"github.com/wasmtools/wasmtools/plugins"
	"github.com/wasmtools/wasmtools/sandbox"
)

// Load the plugins of a folder into a catalogue, and call a tool in an
// instance of its plugin.
func Example() {
	ctx := context.Background()
	rt, _ := sandbox.NewRuntime(sandbox.Options{})
	defer rt.Close(ctx)

	cat, errs := plugins.LoadAll(ctx, rt, []string{testplugins.Root() + "/examples/plugins/dist/counter.wasm"}, nil)
	if len(errs) > 0 {
		fmt.Println(errs)
		return
	}
	defer cat.Close(ctx)
	for _, t := range cat.Tools() {
		fmt.Println("tool:", t.Name, "from plugin", t.Plugin().Name(), "speaking", t.Plugin().Interface())
	}

	tool, _ := cat.Tool("count")
	inst, _ := tool.Plugin().NewInstance(ctx)
	defer inst.Close(ctx)
	for range 2 {
		res, _ := inst.CallTool(ctx, &plugins.Call{Tool: tool, Arguments: json.RawMessage(`{}`)})
		fmt.Println(string(res.Content[0]))
	}
	// Output:
	// tool: count from plugin counter speaking servlet
	// {"type":"text","text":"1"}
	// {"type":"text","text":"2"}
}
