;; trap: a servlet plugin whose every call traps (unreachable), and whose
;; tool "ok" works, so a test can see a trap reset the instance.
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (import "extism:host/env" "input_length" (func $input_length (result i64)))
  (import "extism:host/env" "input_load_u8" (func $input_load_u8 (param i64) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{\"tools\":[{\"name\":\"boom\",\"inputSchema\":{\"type\":\"object\"}},{\"name\":\"calls\",\"inputSchema\":{\"type\":\"object\"}}]}")
  (data (i32.const 512) "{\"content\":[{\"type\":\"text\",\"text\":\"n\"}]}")
  (global $calls (mut i32) (i32.const 0))
  (func $emit (param $ptr i32) (param $len i32)
    (local $off i64) (local $i i32)
    (local.set $off (call $alloc (i64.extend_i32_u (local.get $len))))
    (block $done (loop $copy
      (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
      (call $store_u8 (i64.add (local.get $off) (i64.extend_i32_u (local.get $i)))
        (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $copy)))
    (call $output_set (local.get $off) (i64.extend_i32_u (local.get $len))))
  (func (export "describe") (result i32)
    (call $emit (i32.const 0) (i32.const 108)) (i32.const 0))
  ;; The tool is told apart by the 20th input byte (index 19): {"params":{"name":"boom" vs "calls".
  (func (export "call") (result i32)
    (global.set $calls (i32.add (global.get $calls) (i32.const 1)))
    (if (i32.eq (call $input_load_u8 (i64.const 19)) (i32.const 98)) ;; 'b'
      (then unreachable))
    ;; "calls": answer with the count (one digit, mod 10) of calls so far.
    (i32.store8 (i32.const 547) (i32.add (i32.const 48) (i32.rem_u (global.get $calls) (i32.const 10))))
    (call $emit (i32.const 512) (i32.const 40)) (i32.const 0))
)
