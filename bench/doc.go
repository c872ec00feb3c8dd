// Package bench holds the benchmarks that put wasmtools beside the
// alternatives its users have, measured on the same machine in the same
// run (issue 7). It has no code of its own beyond this comment: the
// benchmarks are in its _test.go files, the baseline MCP server in
// internal/native (run as a process by internal/nativeserver), and the
// report generator in cmd/benchreport.
//
// `make bench` builds the plugins, runs the benchmarks and writes
// docs/BENCHMARKS.md and docs/benchmarks.png; `make bench-short` runs every
// benchmark once, to keep them compiling and working.
//
// The baselines, each named by the last element of a benchmark's name:
//
//   - raw-wazero: the same module on wazero with the least host code that
//     runs it (an Extism kernel of closures over one byte slice, no checks,
//     no deadline). The floor.
//   - extism-sdk: the Extism Go SDK (github.com/extism/go-sdk) as shipped,
//     which runs Extism's kernel as a second Wasm module per instance.
//   - native: the same tool written as a native Go handler on a go-sdk
//     server in the same process: no isolation at all.
//   - raw-wazero-tool: the plugin as a go-sdk tool on raw-wazero's terms,
//     an instance per session (rawtool_test.go): the floor of any Wasm
//     host on the go-sdk, in the warm call and concurrency benchmarks.
//   - process-per-session: a small native go-sdk MCP server binary started
//     per client over stdio, which is how clients are isolated today.
//
// bench is a module of its own (bench/go.mod, which replaces the main
// module with ../), so that what only the benchmarks need, the Extism SDK
// and gonum's plot, stays out of the main go.mod. Unlike the main module's
// packages, this package imports wazero and the MCP SDK directly: it
// measures them.
package bench
