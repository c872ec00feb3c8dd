;; hostilevalidate: a servlet plugin listing a tool, "blowup", whose input
;; schema applies itself twice at each level of an array through anyOf
;; (issue 12): validating {"x":[[[…]]]} costs 2^depth, 4 s for 40 bytes,
;; and a validator cannot be interrupted. The host must refuse the schema
;; at load, saying why. Tool "schema_ok" has an ordinary schema.
;;
;; Build: wat2wasm hostilevalidate.wat -o hostilevalidate.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{\"tools\":[{\"name\":\"blowup\",\"inputSchema\":{\"type\":\"object\",\"properties\":{\"x\":{\"$ref\":\"#/$defs/l\"}},\"$defs\":{\"l\":{\"anyOf\":[{\"items\":{\"$ref\":\"#/$defs/l\"}},{\"items\":{\"$ref\":\"#/$defs/l\"}}]}}}},{\"name\":\"schema_ok\",\"inputSchema\":{\"type\":\"object\"}}]}")
  (data (i32.const 1024) "{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}")

  (func $strlen (param $p i32) (result i32)
    (local $n i32)
    (block $end (loop $next
      (br_if $end (i32.eqz (i32.load8_u (i32.add (local.get $p) (local.get $n)))))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $next)))
    (local.get $n))

  ;; $emit sets the output to the NUL-terminated string at ptr.
  (func $emit (param $ptr i32)
    (local $off i64) (local $i i32) (local $len i32)
    (local.set $len (call $strlen (local.get $ptr)))
    (local.set $off (call $alloc (i64.extend_i32_u (local.get $len))))
    (block $done (loop $copy
      (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
      (call $store_u8 (i64.add (local.get $off) (i64.extend_i32_u (local.get $i)))
        (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $copy)))
    (call $output_set (local.get $off) (i64.extend_i32_u (local.get $len))))

  (func (export "describe") (result i32) (call $emit (i32.const 0)) (i32.const 0))
  (func (export "call") (result i32) (call $emit (i32.const 1024)) (i32.const 0))
)
