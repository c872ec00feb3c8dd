;; hostilepause: a servlet plugin whose tool "sample_spin" calls
;; create_message (sampling) in a loop, for ever, with a 1 MiB request that
;; is slow to read and that the host refuses: {"_meta":{"a":[[],[],...]}}
;; has no messages. The host's time reading it is the guest's: it must
;; count against the call timeout, which must stop the call. (While the
;; whole of create_message paused the deadline, reading the request took
;; about 300 times as long as the guest's own part of each round, and the
;; call ran for hours.) Tool "pause_ok" answers "ok".
;;
;; Build: wat2wasm hostilepause.wat -o hostilepause.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "free" (func $free (param i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "store_u64" (func $store_u64 (param i64 i64)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (import "extism:host/env" "input_length" (func $input_length (result i64)))
  (import "extism:host/env" "input_load_u8" (func $input_load_u8 (param i64) (result i32)))
  (import "extism:host/user" "create_message" (func $create_message (param i64) (result i64)))
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
  ;; The request's head, 15 bytes, and its tail, 5.
  (data (i32.const 2304) "{\"_meta\":{\"a\":[")
  (data (i32.const 2336) "[]]}}")
  (data (i32.const 2368) "[],")

  (data (i32.const 4096) "pause_ok\00sample_spin\00")
  (table funcref (elem $ok $sample_spin))

  (func $ok (type $tool) (call $text (i32.const 2048)) (i32.const 0))

  ;; $request builds the request in a new block of n bytes (n = 20 + 3k):
  ;; the head, k times "[],", the tail.
  (func $request (param $n i64) (result i64)
    (local $off i64) (local $i i64) (local $end i64)
    (local.set $off (call $alloc (local.get $n)))
    (block $done (loop $head
      (br_if $done (i64.ge_u (local.get $i) (i64.const 15)))
      (call $store_u8 (i64.add (local.get $off) (local.get $i))
        (i32.load8_u (i32.add (i32.const 2304) (i32.wrap_i64 (local.get $i)))))
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (br $head)))
    ;; "[],[],[]," eight bytes at a time ("[],[],[]" then "," and so on:
    ;; the pattern repeats every 3 bytes, so each 24 bytes are 3 words).
    (local.set $end (i64.sub (local.get $n) (i64.const 5)))
    (block $done (loop $body
      (br_if $done (i64.gt_u (i64.add (local.get $i) (i64.const 24)) (local.get $end)))
      ;; little-endian words of "[],[],[]", ",[],[],[", "],[],[],"
      (call $store_u64 (i64.add (local.get $off) (local.get $i)) (i64.const 0x5d5b2c5d5b2c5d5b))
      (call $store_u64 (i64.add (local.get $off) (i64.add (local.get $i) (i64.const 8))) (i64.const 0x5b2c5d5b2c5d5b2c))
      (call $store_u64 (i64.add (local.get $off) (i64.add (local.get $i) (i64.const 16))) (i64.const 0x2c5d5b2c5d5b2c5d))
      (local.set $i (i64.add (local.get $i) (i64.const 24)))
      (br $body)))
    (block $done (loop $rest
      (br_if $done (i64.ge_u (local.get $i) (local.get $end)))
      (call $store_u8 (i64.add (local.get $off) (local.get $i))
        (i32.load8_u (i32.add (i32.const 2368) (i32.wrap_i64 (i64.rem_u (i64.sub (local.get $i) (i64.const 15)) (i64.const 3))))))
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (br $rest)))
    (local.set $i (i64.const 0))
    (block $done (loop $tail
      (br_if $done (i64.ge_u (local.get $i) (i64.const 5)))
      (call $store_u8 (i64.add (local.get $off) (i64.add (local.get $end) (local.get $i)))
        (i32.load8_u (i32.add (i32.const 2336) (i32.wrap_i64 (local.get $i)))))
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (br $tail)))
    (local.get $off))

  (func $sample_spin (type $tool)
    (local $req i64)
    ;; 20 + 3 * 349518 = 1048574 bytes, under the 1 MiB a host function takes.
    (local.set $req (call $request (i64.const 1048574)))
    (loop $again
      (call $free (call $create_message (local.get $req)))
      (br $again))
    (i32.const 0))
)
