;; hostileschema: a servlet plugin listing a tool, "selfref", whose input
;; schema refers to itself in place ({"type":"object","$ref":"#"}): a
;; validator that follows the reference recurses without end. The host
;; must refuse the schema at load, or fail the call, but never overflow
;; its own stack. Tool "schema_ok" has an ordinary schema and works.
;;
;; Build: wat2wasm hostileschema.wat -o hostileschema.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "{\"tools\":[{\"name\":\"selfref\",\"inputSchema\":{\"type\":\"object\",\"$ref\":\"#\"}},{\"name\":\"schema_ok\",\"inputSchema\":{\"type\":\"object\"}}]}")
  (data (i32.const 512) "{\"content\":[{\"type\":\"text\",\"text\":\"ok\"}]}")

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
  (func (export "call") (result i32) (call $emit (i32.const 512)) (i32.const 0))
)
