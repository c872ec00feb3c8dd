;; logcall: a servlet plugin whose one tool, "log", writes a line through
;; the Extism kernel's log_info and answers "logged": the deepest point of
;; an ordinary call is a kernel call, and the host's stack test
;; (host/stack_test.go) measures how deep a call's stack is there.
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (import "extism:host/env" "log_info" (func $log_info (param i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{\"tools\":[{\"name\":\"log\",\"inputSchema\":{\"type\":\"object\"}}]}")
  (data (i32.const 512) "{\"content\":[{\"type\":\"text\",\"text\":\"logged\"}]}")
  (data (i32.const 1024) "deep")
  ;; block copies len bytes at ptr into a new kernel block.
  (func $block (param $ptr i32) (param $len i32) (result i64)
    (local $off i64) (local $i i32)
    (local.set $off (call $alloc (i64.extend_i32_u (local.get $len))))
    (block $done (loop $copy
      (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
      (call $store_u8 (i64.add (local.get $off) (i64.extend_i32_u (local.get $i)))
        (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $copy)))
    (local.get $off))
  (func (export "describe") (result i32)
    (call $output_set (call $block (i32.const 0) (i32.const 58)) (i64.const 58)) (i32.const 0))
  (func (export "call") (result i32)
    (call $log_info (call $block (i32.const 1024) (i32.const 4)))
    (call $output_set (call $block (i32.const 512) (i32.const 45)) (i64.const 45)) (i32.const 0))
)
