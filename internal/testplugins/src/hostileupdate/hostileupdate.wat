;; hostileupdate: a v2 plugin serving the resource flood://listed and the
;; template flood://item/{id}, whose tools call notify_resource_updated:
;; update_flood in a tight loop for its own flood://item/1, until the call's
;; deadline stops it; update_burst 10 times for flood://item/1, then returns
;; (many short calls); update_foreign once for counter://secret, which is
;; not its own. Issue 12: 100 000 updates reached another session, and a
;; plugin could say any URI changed. Tool "update_ok" works.
;;
;; Build: wat2wasm hostileupdate.wat -o hostileupdate.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (import "extism:host/env" "input_length" (func $input_length (result i64)))
  (import "extism:host/env" "input_load_u8" (func $input_load_u8 (param i64) (result i32)))
  (import "extism:host/user" "notify_resource_updated" (func $notify_resource_updated (param i64)))
  (memory (export "memory") 1)
  ;; --- Shared by the hostile fixtures: tool dispatch and output helpers. ---
  ;; Strings are NUL-terminated. Layout of linear memory (one page):
  ;;   0..511      JSON fragments used by describe and $text
  ;;   2048..4095  this fixture's texts and host-function inputs
  ;;   4096..      the tool names, NUL-separated, in table order
  ;;   16384..     scratch where describe and $text assemble their output
  (type $tool (func (result i32)))
  (data (i32.const 0) "{\"tools\":[")
  (data (i32.const 64) "{\"name\":\"")
  (data (i32.const 128) "\",\"inputSchema\":{\"type\":\"object\"}}")
  (data (i32.const 192) ",")
  (data (i32.const 256) "]}")
  (data (i32.const 320) "{\"content\":[{\"type\":\"text\",\"text\":\"")
  (data (i32.const 384) "\"}]}")

  (func $strlen (param $p i32) (result i32)
    (local $n i32)
    (block $end (loop $next
      (br_if $end (i32.eqz (i32.load8_u (i32.add (local.get $p) (local.get $n)))))
      (local.set $n (i32.add (local.get $n) (i32.const 1)))
      (br $next)))
    (local.get $n))

  ;; $append copies the string at src to dst and returns where it ends.
  (func $append (param $dst i32) (param $src i32) (result i32)
    (local $n i32)
    (local.set $n (call $strlen (local.get $src)))
    (memory.copy (local.get $dst) (local.get $src) (local.get $n))
    (i32.add (local.get $dst) (local.get $n)))

  ;; $block copies len bytes at ptr into a new kernel block.
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

  ;; $cblock puts the string at ptr in a new kernel block.
  (func $cblock (param $ptr i32) (result i64)
    (call $block (local.get $ptr) (call $strlen (local.get $ptr))))

  (func $emit (param $ptr i32) (param $len i32)
    (call $output_set (call $block (local.get $ptr) (local.get $len)) (i64.extend_i32_u (local.get $len))))

  ;; $text sets the output to a text result holding the string at ptr
  ;; (which must need no JSON escaping).
  (func $text (param $ptr i32)
    (local $end i32)
    (local.set $end (call $append (i32.const 16384) (i32.const 320)))
    (local.set $end (call $append (local.get $end) (local.get $ptr)))
    (local.set $end (call $append (local.get $end) (i32.const 384)))
    (call $emit (i32.const 16384) (i32.sub (local.get $end) (i32.const 16384))))

  ;; list_tools lists every name at 4096, each with an empty object schema.
  (func (export "list_tools") (result i32)
    (local $p i32) (local $end i32)
    (local.set $end (call $append (i32.const 16384) (i32.const 0)))
    (local.set $p (i32.const 4096))
    (block $done (loop $each
      (br_if $done (i32.eqz (i32.load8_u (local.get $p))))
      (if (i32.ne (local.get $p) (i32.const 4096))
        (then (local.set $end (call $append (local.get $end) (i32.const 192)))))
      (local.set $end (call $append (local.get $end) (i32.const 64)))
      (local.set $end (call $append (local.get $end) (local.get $p)))
      (local.set $end (call $append (local.get $end) (i32.const 128)))
      (local.set $p (i32.add (i32.add (local.get $p) (call $strlen (local.get $p))) (i32.const 1)))
      (br $each)))
    (local.set $end (call $append (local.get $end) (i32.const 256)))
    (call $emit (i32.const 16384) (i32.sub (local.get $end) (i32.const 16384)))
    (i32.const 0))

  ;; $which returns the index of the called tool among the names at 4096,
  ;; or -1. The v2 input starts {"request":{"name":" so the name is at
  ;; input index 20, up to the next quote.
  (func $which (result i32)
    (local $p i32) (local $idx i32) (local $i i32) (local $c i32) (local $n i64) (local $at i64)
    (local.set $n (call $input_length))
    (local.set $p (i32.const 4096))
    (block $none (loop $entry
      (br_if $none (i32.eqz (i32.load8_u (local.get $p))))
      (local.set $i (i32.const 0))
      (block $mismatch (loop $cmp
        (local.set $at (i64.extend_i32_u (i32.add (i32.const 20) (local.get $i))))
        (br_if $mismatch (i64.ge_u (local.get $at) (local.get $n)))
        (local.set $c (i32.load8_u (i32.add (local.get $p) (local.get $i))))
        (if (i32.eqz (local.get $c))
          (then
            (br_if $mismatch (i32.ne (call $input_load_u8 (local.get $at)) (i32.const 34)))
            (return (local.get $idx))))
        (br_if $mismatch (i32.ne (local.get $c) (call $input_load_u8 (local.get $at))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $cmp)))
      (local.set $p (i32.add (i32.add (local.get $p) (call $strlen (local.get $p))) (i32.const 1)))
      (local.set $idx (i32.add (local.get $idx) (i32.const 1)))
      (br $entry)))
    (i32.const -1))

  ;; call_tool runs the tool function at the called tool's index in the table.
  (func (export "call_tool") (result i32)
    (call_indirect (type $tool) (call $which)))
  ;; --- End of the shared part. ---
  (data (i32.const 2048) "ok")
  (data (i32.const 2112) "{\"uri\":\"flood://item/1\"}")
  (data (i32.const 2176) "{\"uri\":\"counter://secret\"}")
  (data (i32.const 2240) "{\"resources\":[{\"uri\":\"flood://listed\",\"name\":\"listed\"}]}")
  (data (i32.const 2368) "{\"resourceTemplates\":[{\"uriTemplate\":\"flood://item/{id}\",\"name\":\"item\"}]}")
  (data (i32.const 2496) "{\"contents\":[{\"uri\":\"flood://listed\",\"text\":\"listed\"}]}")

  (data (i32.const 4096) "update_ok\00update_flood\00update_burst\00update_foreign\00")
  (table funcref (elem $ok $update_flood $update_burst $update_foreign))

  (func (export "list_resources") (result i32)
    (call $emit (i32.const 2240) (call $strlen (i32.const 2240))) (i32.const 0))
  (func (export "list_resource_templates") (result i32)
    (call $emit (i32.const 2368) (call $strlen (i32.const 2368))) (i32.const 0))
  (func (export "read_resource") (result i32)
    (call $emit (i32.const 2496) (call $strlen (i32.const 2496))) (i32.const 0))

  (func $ok (type $tool) (call $text (i32.const 2048)) (i32.const 0))
  (func $update_flood (type $tool)
    (local $msg i64)
    (local.set $msg (call $cblock (i32.const 2112)))
    (loop $forever (call $notify_resource_updated (local.get $msg)) (br $forever))
    (i32.const 0))
  (func $update_burst (type $tool)
    (local $msg i64) (local $i i32)
    (local.set $msg (call $cblock (i32.const 2112)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (i32.const 10)))
      (call $notify_resource_updated (local.get $msg))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (call $text (i32.const 2048)) (i32.const 0))
  (func $update_foreign (type $tool)
    (call $notify_resource_updated (call $cblock (i32.const 2176)))
    (call $text (i32.const 2048)) (i32.const 0))
)
