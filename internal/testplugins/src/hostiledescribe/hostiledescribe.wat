;; hostiledescribe: a servlet plugin whose describe export calls an MCP
;; host function (notify_logging_message), which is not available while
;; the host lists tools. Loading it must fail with an error saying so.
;;
;; Build: wat2wasm hostiledescribe.wat -o hostiledescribe.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/user" "notify_logging_message" (func $notify_logging_message (param i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{\"level\":\"info\",\"data\":\"listing\"}")
  (func (export "describe") (result i32)
    (local $off i64) (local $i i32) (local $n i32)
    (local.set $n (i32.const 33))
    (local.set $off (call $alloc (i64.extend_i32_u (local.get $n))))
    (block $done (loop $copy
      (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
      (call $store_u8 (i64.add (local.get $off) (i64.extend_i32_u (local.get $i)))
        (i32.load8_u (local.get $i)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $copy)))
    (call $notify_logging_message (local.get $off))
    (i32.const 0))
  (func (export "call") (result i32) (i32.const 0))
)
