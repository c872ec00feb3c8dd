;; badtask: a servlet plugin listing a tool whose execution.taskSupport is not forbidden, optional or required.
;; Loading it must fail and say why.
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{\"tools\":[{\"name\":\"bad\",\"execution\":{\"taskSupport\":\"always\"}}]}")
  (func (export "describe") (result i32)
    (local $off i64) (local $i i32)
    (local.set $off (call $alloc (i64.const 63)))
    (block $done (loop $copy
      (br_if $done (i32.ge_u (local.get $i) (i32.const 63)))
      (call $store_u8 (i64.add (local.get $off) (i64.extend_i32_u (local.get $i)))
        (i32.load8_u (local.get $i)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $copy)))
    (call $output_set (local.get $off) (i64.const 63))
    (i32.const 0))
  (func (export "call") (result i32) (i32.const 0))
)
