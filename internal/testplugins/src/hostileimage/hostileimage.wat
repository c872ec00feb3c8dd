;; hostileimage: a servlet plugin for pre-initialised images. Its
;; _initialize grows the memory to 64 pages and writes 7 in every 4 KiB
;; of pages 1 to 63, so that its image is 64 pages of non-zero memory.
;; "touch_all" writes 0xAA in every 4 KiB of every page but the first
;; (all of the image's, and any grown since) and answers "touched N
;; pages"; "check" answers "pristine" while pages 1 to 63 hold the
;; image's bytes, else "dirty"; "grow" grows one page at a time until
;; memory.grow fails (the policy's memory limit) and answers "grew to N
;; pages". Tool "grow_ok" works.
;;
;; Build: wat2wasm hostileimage.wat -o hostileimage.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
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
  (data (i32.const 2064) "grew to ")
  (data (i32.const 2080) " pages")
  (data (i32.const 2096) "pristine")
  (data (i32.const 2112) "dirty")
  (data (i32.const 2128) "touched ")

  (data (i32.const 4096) "grow_ok\00grow\00touch_all\00check\00")
  (table funcref (elem $ok $grow $touch_all $check))

  (func (export "_initialize")
    (local $addr i32)
    (drop (memory.grow (i32.sub (i32.const 64) (memory.size))))
    (local.set $addr (i32.const 65536))
    (block $done (loop $fill
      (br_if $done (i32.ge_u (local.get $addr) (i32.const 4194304)))
      (i32.store8 (local.get $addr) (i32.const 7))
      (local.set $addr (i32.add (local.get $addr) (i32.const 4096)))
      (br $fill))))

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

  ;; $pages answers the text at $what, then n, then " pages".
  (func $pages (param $what i32) (param $n i32)
    (local $end i32)
    (local.set $end (call $append (i32.const 3072) (local.get $what)))
    (local.set $end (call $itoa (local.get $end) (local.get $n)))
    (local.set $end (call $append (local.get $end) (i32.const 2080)))
    (i32.store8 (local.get $end) (i32.const 0))
    (call $text (i32.const 3072)))

  (func $grow (type $tool)
    (block $full (loop $more
      (br_if $full (i32.eq (memory.grow (i32.const 1)) (i32.const -1)))
      (br $more)))
    (call $pages (i32.const 2064) (memory.size))
    (i32.const 0))

  (func $touch_all (type $tool)
    (local $addr i32) (local $end i32)
    (local.set $end (i32.mul (memory.size) (i32.const 65536)))
    (local.set $addr (i32.const 65536))
    (block $done (loop $touch
      (br_if $done (i32.ge_u (local.get $addr) (local.get $end)))
      (i32.store8 (local.get $addr) (i32.const 0xaa))
      (local.set $addr (i32.add (local.get $addr) (i32.const 4096)))
      (br $touch)))
    (call $pages (i32.const 2128) (i32.sub (memory.size) (i32.const 1)))
    (i32.const 0))

  (func $check (type $tool)
    (local $addr i32)
    (local.set $addr (i32.const 65536))
    (block $done (loop $each
      (br_if $done (i32.ge_u (local.get $addr) (i32.const 4194304)))
      (if (i32.ne (i32.load8_u (local.get $addr)) (i32.const 7))
        (then (call $text (i32.const 2112)) (return (i32.const 0))))
      (local.set $addr (i32.add (local.get $addr) (i32.const 4096)))
      (br $each)))
    (call $text (i32.const 2096))
    (i32.const 0))
)
