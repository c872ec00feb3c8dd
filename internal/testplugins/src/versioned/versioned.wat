;; versioned: a servlet plugin whose tool "version" answers "v1". Tests make
;; a second version by replacing the bytes "v1" with "v2" in the module's
;; data, so that the two versions differ in sha256 and in their answer.
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{\"tools\":[{\"name\":\"version\",\"inputSchema\":{\"type\":\"object\"}}]}")
  (data (i32.const 256) "{\"content\":[{\"type\":\"text\",\"text\":\"v1\"}]}")
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
  (func (export "describe") (result i32) (call $emit (i32.const 0) (i32.const 62)) (i32.const 0))
  (func (export "call") (result i32) (call $emit (i32.const 256) (i32.const 41)) (i32.const 0))
)
