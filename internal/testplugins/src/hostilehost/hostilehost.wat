;; hostilehost: a servlet plugin whose tools spend host memory that no
;; limit used to count (project issue 12, part B):
;;   table_grow   grows a table with no declared maximum by 65536 entries
;;                at a time until table.grow fails, and answers "table
;;                grew to N entries" (each entry costs the host 8 bytes);
;;   var_ghost    deletes a never-set 1 000 000-byte var key 8 times, then
;;                sets one var of 8 000 000 bytes, and answers "stored 8 MB"
;;                (the deletes used to wrap the vars' byte count around
;;                below zero, and the big var brought it back to 8);
;;   var_small    sets vars of a 4-byte key and a 1-byte value, each key
;;                new, until var_set traps (vars used to cost the host
;;                about 18 times the bytes they were counted as).
;;   spin_memory  logs "spinning", then writes to its memory forever
;;                (closing the module under it must not unmap the
;;                memory it writes to).
;; Tool "host_ok" works.
;;
;; sandbox/hostile_test.go drives it.
;;
;; Build: wat2wasm hostilehost.wat -o hostilehost.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "free" (func $free (param i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "store_u64" (func $store_u64 (param i64 i64)))
  (import "extism:host/env" "var_set" (func $var_set (param i64 i64)))
  (import "extism:host/env" "log_info" (func $log_info (param i64)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (import "extism:host/env" "input_length" (func $input_length (result i64)))
  (import "extism:host/env" "input_load_u8" (func $input_load_u8 (param i64) (result i32)))
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

  ;; describe lists every name at 4096, each with an empty object schema.
  (func (export "describe") (result i32)
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
  ;; or -1. The servlet input starts {"params":{"name":" so the name is
  ;; at input index 19, up to the next quote.
  (func $which (result i32)
    (local $p i32) (local $idx i32) (local $i i32) (local $c i32) (local $n i64) (local $at i64)
    (local.set $n (call $input_length))
    (local.set $p (i32.const 4096))
    (block $none (loop $entry
      (br_if $none (i32.eqz (i32.load8_u (local.get $p))))
      (local.set $i (i32.const 0))
      (block $mismatch (loop $cmp
        (local.set $at (i64.extend_i32_u (i32.add (i32.const 19) (local.get $i))))
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

  ;; call runs the tool function at the called tool's index in the table.
  (func (export "call") (result i32)
    (call_indirect (type $tool) (call $which)))
  ;; --- End of the shared part. ---
  (data (i32.const 2048) "ok")
  (data (i32.const 2064) "table grew to ")
  (data (i32.const 2096) " entries")
  (data (i32.const 2112) "stored 8 MB")
  (data (i32.const 2144) "var_set never trapped")
  (data (i32.const 2176) "spinning")

  (data (i32.const 4096) "host_ok\00table_grow\00var_ghost\00var_small\00spin_memory\00")
  (table funcref (elem $ok $table_grow $var_ghost $var_small $spin_memory))
  ;; A table with no maximum: only the host's cap stops table.grow.
  (table $big 0 funcref)

  (func $ok (type $tool) (call $text (i32.const 2048)) (i32.const 0))

  ;; $itoa writes n in decimal at dst and returns where it ends.
  (func $itoa (param $dst i32) (param $n i32) (result i32)
    (local $p i32) (local $len i32)
    (local.set $p (i32.const 3071))
    (loop $digit
      (i32.store8 (local.get $p) (i32.add (i32.const 48) (i32.rem_u (local.get $n) (i32.const 10))))
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (local.set $len (i32.add (local.get $len) (i32.const 1)))
      (local.set $n (i32.div_u (local.get $n) (i32.const 10)))
      (br_if $digit (i32.ne (local.get $n) (i32.const 0))))
    (memory.copy (local.get $dst) (i32.add (local.get $p) (i32.const 1)) (local.get $len))
    (i32.add (local.get $dst) (local.get $len)))

  (func $table_grow (type $tool)
    (local $end i32)
    (block $full (loop $more
      (br_if $full (i32.eq (table.grow $big (ref.null func) (i32.const 65536)) (i32.const -1)))
      (br $more)))
    (local.set $end (call $append (i32.const 3072) (i32.const 2064)))
    (local.set $end (call $itoa (local.get $end) (table.size $big)))
    (local.set $end (call $append (local.get $end) (i32.const 2096)))
    (i32.store8 (local.get $end) (i32.const 0))
    (call $text (i32.const 3072))
    (i32.const 0))

  (func $var_ghost (type $tool)
    (local $i i32) (local $key i64) (local $value i64)
    (block $done (loop $delete
      (br_if $done (i32.ge_u (local.get $i) (i32.const 8)))
      (local.set $key (call $alloc (i64.const 1000000)))
      (call $store_u8 (local.get $key) (i32.const 0x67))
      (call $var_set (local.get $key) (i64.const 0))
      (call $free (local.get $key))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $delete)))
    (local.set $key (call $alloc (i64.const 8)))
    (local.set $value (call $alloc (i64.const 8000000)))
    (call $var_set (local.get $key) (local.get $value))
    (call $text (i32.const 2112))
    (i32.const 0))

  (func $var_small (type $tool)
    (local $i i32) (local $key i64) (local $value i64)
    (block $done (loop $set
      (br_if $done (i32.ge_u (local.get $i) (i32.const 1000000)))
      (local.set $key (call $alloc (i64.const 4)))
      (call $store_u8 (local.get $key) (local.get $i))
      (call $store_u8 (i64.add (local.get $key) (i64.const 1)) (i32.shr_u (local.get $i) (i32.const 8)))
      (call $store_u8 (i64.add (local.get $key) (i64.const 2)) (i32.shr_u (local.get $i) (i32.const 16)))
      (local.set $value (call $alloc (i64.const 1)))
      (call $var_set (local.get $key) (local.get $value))
      (call $free (local.get $value))
      (call $free (local.get $key))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $set)))
    (call $text (i32.const 2144))
    (i32.const 0))

  (func $spin_memory (type $tool)
    (local $i i32)
    (call $log_info (call $cblock (i32.const 2176)))
    (loop $forever
      (i32.store (i32.and (local.get $i) (i32.const 0xfffc)) (local.get $i))
      (local.set $i (i32.add (local.get $i) (i32.const 4)))
      (br $forever))
    (i32.const 0))
)
