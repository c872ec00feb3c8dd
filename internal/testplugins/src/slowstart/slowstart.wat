;; slowstart: a good servlet plugin that is merely slow to start: its
;; start function counts to 8e6 (about a second with the sandbox's interruption checks, more than the reloader's
;; SlowLoad of 500 ms, far less than the load timeout), then it serves the
;; tool "late", which answers "late". cmd/wasmtools' first-list test uses
;; it: the first list does not wait for it, and list_changed follows once
;; its second load is in.
;;
;; Build: wat2wasm slowstart.wat -o slowstart.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{\"tools\":[{\"name\":\"late\",\"inputSchema\":{\"type\":\"object\"}}]}")
  (data (i32.const 256) "{\"content\":[{\"type\":\"text\",\"text\":\"late\"}]}")
  (global $sink (mut i64) (i64.const 0))
  (func $count
    (local $i i64)
    (loop $spin
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (br_if $spin (i64.lt_u (local.get $i) (i64.const 8000000))))
    (global.set $sink (local.get $i)))
  (start $count)
  ;; $out copies len bytes at ptr into a block and makes it the output.
  (func $out (param $ptr i32) (param $len i32)
    (local $blk i64) (local $i i32)
    (local.set $blk (call $alloc (i64.extend_i32_u (local.get $len))))
    (block $done (loop $copy
      (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
      (call $store_u8 (i64.add (local.get $blk) (i64.extend_i32_u (local.get $i)))
        (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $copy)))
    (call $output_set (local.get $blk) (i64.extend_i32_u (local.get $len))))
  (func (export "describe") (result i32)
    (call $out (i32.const 0) (i32.const 59)) (i32.const 0))
  (func (export "call") (result i32)
    (call $out (i32.const 256) (i32.const 43)) (i32.const 0))
)
