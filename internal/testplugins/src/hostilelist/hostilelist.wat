;; hostilelist: a v2 plugin whose lists are whatever the operator's config
;; says, byte for byte, page after page: list_tools outputs config "tools",
;; list_prompts "prompts", list_resources "resources" and
;; list_resource_templates "templates" (with a nextCursor, a list never
;; ends). When config "spin" is set, list_tools never returns. call_tool
;; fails. plugins/hostile_test.go drives it: tool lists of 100 001 tools,
;; of 4 MB pages, of endless pages (project issue 12).
;;
;; Build: wat2wasm hostilelist.wat -o hostilelist.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "length" (func $length (param i64) (result i64)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (import "extism:host/env" "config_get" (func $config_get (param i64) (result i64)))
  (memory (export "memory") 1)
  (data (i32.const 0) "tools")
  (data (i32.const 16) "prompts")
  (data (i32.const 32) "resources")
  (data (i32.const 48) "templates")
  (data (i32.const 64) "spin")

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

  (func (export "list_tools") (result i32)
    (if (i64.ne (call $config (i32.const 64) (i32.const 4)) (i64.const 0))
      (then (loop $forever (br $forever))))
    (call $output (call $config (i32.const 0) (i32.const 5)))
    (i32.const 0))
  (func (export "list_prompts") (result i32)
    (call $output (call $config (i32.const 16) (i32.const 7)))
    (i32.const 0))
  (func (export "list_resources") (result i32)
    (call $output (call $config (i32.const 32) (i32.const 9)))
    (i32.const 0))
  (func (export "list_resource_templates") (result i32)
    (call $output (call $config (i32.const 48) (i32.const 9)))
    (i32.const 0))
  (func (export "call_tool") (result i32)
    (i32.const 1))
)
