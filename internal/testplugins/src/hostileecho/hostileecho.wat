;; hostileecho: a servlet plugin whose outputs are whatever the operator's
;; config says, byte for byte: describe outputs config "describe", call
;; outputs config "result" and, when config "error" is set, fails with it
;; as its message. The fuzz tests in plugins and host feed arbitrary bytes
;; through the ABI with it, as a hostile plugin could.
;;
;; Build: wat2wasm hostileecho.wat -o hostileecho.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "length" (func $length (param i64) (result i64)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (import "extism:host/env" "error_set" (func $error_set (param i64)))
  (import "extism:host/env" "config_get" (func $config_get (param i64) (result i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "describe")
  (data (i32.const 16) "result")
  (data (i32.const 32) "error")

  ;; $config returns the block holding config key (ptr, len), or 0.
  (func $config (param $ptr i32) (param $len i32) (result i64)
    (local $key i64) (local $i i32)
    (local.set $key (call $alloc (i64.extend_i32_u (local.get $len))))
    (block $done (loop $copy
      (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
      (call $store_u8 (i64.add (local.get $key) (i64.extend_i32_u (local.get $i)))
        (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $copy)))
    (call $config_get (local.get $key)))

  ;; $output sets the output to the block at off (none for 0).
  (func $output (param $off i64)
    (if (i64.ne (local.get $off) (i64.const 0))
      (then (call $output_set (local.get $off) (call $length (local.get $off))))))

  (func (export "describe") (result i32)
    (call $output (call $config (i32.const 0) (i32.const 8)))
    (i32.const 0))

  (func (export "call") (result i32)
    (local $err i64)
    (local.set $err (call $config (i32.const 32) (i32.const 5)))
    (if (i64.ne (local.get $err) (i64.const 0))
      (then (call $error_set (local.get $err)) (return (i32.const 1))))
    (call $output (call $config (i32.const 16) (i32.const 6)))
    (i32.const 0))
)
