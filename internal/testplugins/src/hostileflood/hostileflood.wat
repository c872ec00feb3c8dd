;; hostileflood: a servlet plugin whose tools call one host function in a
;; tight loop until the call's deadline stops them: notify_progress,
;; notify_logging_message, the kernel's log_info, and WASI fd_write to
;; stdout. The host must stay responsive, and what reaches the client and
;; the host's log must stay bounded. Tool "flood_ok" works.
;;
;; Issue 12's floods, by size rather than count: log_huge sends one log
;; message with 20 000 bytes of data; log_big sends 15 000-byte messages in
;; a loop; log_burst sends 20 messages of 12 000 bytes and returns (many
;; short calls); records_burst writes 20 records of 60 000 bytes and
;; returns; meta_huge returns a one-character block with 200 000 bytes of
;; _meta; blocks_many returns 5 000 empty text blocks; progress_big sends
;; progress with a 60 000-byte message in a loop.
;;
;; Build: wat2wasm hostileflood.wat -o hostileflood.wasm (make testplugins)
(module
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (import "extism:host/env" "input_length" (func $input_length (result i64)))
  (import "extism:host/env" "input_load_u8" (func $input_load_u8 (param i64) (result i32)))
  (import "extism:host/env" "log_info" (func $log_info (param i64)))
  (import "extism:host/user" "notify_progress" (func $notify_progress (param i64)))
  (import "extism:host/user" "notify_logging_message" (func $notify_logging_message (param i64)))
  (import "extism:host/user" "write_record" (func $write_record (param i64) (result i64)))
  (memory (export "memory") 8)
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
  (data (i32.const 2304) "{\"progress\":1,\"total\":2,\"message\":\"flood\"}")
  (data (i32.const 2368) "{\"level\":\"error\",\"logger\":\"flood\",\"data\":\"flood\"}")
  (data (i32.const 2432) "flood")
  (data (i32.const 2496) "flood\n")
  ;; The iovec for fd_write: buf 2496, len 6; nwritten goes to 2520.
  (data (i32.const 2512) "\c0\09\00\00\06\00\00\00")

  (data (i32.const 2560) "{\"level\":\"info\",\"logger\":\"flood\",\"data\":\"")
  (data (i32.const 2624) "\"}")
  (data (i32.const 2640) "{\"namespace\":\"flood\",\"data\":\"")
  (data (i32.const 2688) "{\"content\":[{\"type\":\"text\",\"text\":\"x\"}],\"_meta\":{\"big\":\"")
  (data (i32.const 2768) "\"}}")
  (data (i32.const 2784) "{\"type\":\"text\",\"text\":\"\"},")
  (data (i32.const 2816) "{\"type\":\"text\",\"text\":\"\"}]}")
  (data (i32.const 2848) "{\"content\":[")
  (data (i32.const 2880) "{\"progress\":1,\"total\":2,\"message\":\"")

  (data (i32.const 4096) "flood_ok\00flood_progress\00flood_log\00flood_kernel_log\00flood_stdout\00"
    "log_huge\00log_big\00log_burst\00records_burst\00meta_huge\00blocks_many\00progress_big\00")
  (table funcref (elem $ok $flood_progress $flood_log $flood_kernel_log $flood_stdout
    $log_huge $log_big $log_burst $records_burst $meta_huge $blocks_many $progress_big))

  ;; $big assembles at 131072 the string at head, n bytes of "a" and the
  ;; string at tail, and returns its length.
  (func $big (param $head i32) (param $n i32) (param $tail i32) (result i32)
    (local $end i32)
    (local.set $end (call $append (i32.const 131072) (local.get $head)))
    (memory.fill (local.get $end) (i32.const 97) (local.get $n))
    (local.set $end (call $append (i32.add (local.get $end) (local.get $n)) (local.get $tail)))
    (i32.sub (local.get $end) (i32.const 131072)))
  ;; $bigblock puts the same in a new kernel block.
  (func $bigblock (param $head i32) (param $n i32) (param $tail i32) (result i64)
    (call $block (i32.const 131072) (call $big (local.get $head) (local.get $n) (local.get $tail))))

  (func $ok (type $tool) (call $text (i32.const 2048)) (i32.const 0))
  (func $flood_progress (type $tool)
    (local $msg i64)
    (local.set $msg (call $cblock (i32.const 2304)))
    (loop $forever (call $notify_progress (local.get $msg)) (br $forever))
    (i32.const 0))
  (func $flood_log (type $tool)
    (local $msg i64)
    (local.set $msg (call $cblock (i32.const 2368)))
    (loop $forever (call $notify_logging_message (local.get $msg)) (br $forever))
    (i32.const 0))
  (func $flood_kernel_log (type $tool)
    (local $msg i64)
    (local.set $msg (call $cblock (i32.const 2432)))
    (loop $forever (call $log_info (local.get $msg)) (br $forever))
    (i32.const 0))
  (func $flood_stdout (type $tool)
    (loop $forever
      (drop (call $fd_write (i32.const 1) (i32.const 2512) (i32.const 1) (i32.const 2520)))
      (br $forever))
    (i32.const 0))
;; Issue 12.
  (func $log_huge (type $tool)
    (call $notify_logging_message (call $bigblock (i32.const 2560) (i32.const 20000) (i32.const 2624)))
    (call $text (i32.const 2048)) (i32.const 0))
  (func $log_big (type $tool)
    (local $msg i64)
    (local.set $msg (call $bigblock (i32.const 2560) (i32.const 15000) (i32.const 2624)))
    (loop $forever (call $notify_logging_message (local.get $msg)) (br $forever))
    (i32.const 0))
  (func $log_burst (type $tool)
    (local $msg i64) (local $i i32)
    (local.set $msg (call $bigblock (i32.const 2560) (i32.const 12000) (i32.const 2624)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (i32.const 20)))
      (call $notify_logging_message (local.get $msg))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (call $text (i32.const 2048)) (i32.const 0))
  (func $records_burst (type $tool)
    (local $rec i64) (local $i i32)
    (local.set $rec (call $bigblock (i32.const 2640) (i32.const 60000) (i32.const 2624)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (i32.const 20)))
      (drop (call $write_record (local.get $rec)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (call $text (i32.const 2048)) (i32.const 0))
  (func $meta_huge (type $tool)
    (local $n i32)
    (local.set $n (call $big (i32.const 2688) (i32.const 200000) (i32.const 2768)))
    (call $emit (i32.const 131072) (local.get $n)) (i32.const 0))
  (func $blocks_many (type $tool)
    (local $end i32) (local $i i32)
    (local.set $end (call $append (i32.const 131072) (i32.const 2848)))
    (block $done (loop $next
      (br_if $done (i32.ge_u (local.get $i) (i32.const 4999)))
      (local.set $end (call $append (local.get $end) (i32.const 2784)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br $next)))
    (local.set $end (call $append (local.get $end) (i32.const 2816)))
    (call $emit (i32.const 131072) (i32.sub (local.get $end) (i32.const 131072))) (i32.const 0))
  (func $progress_big (type $tool)
    (local $msg i64)
    (local.set $msg (call $bigblock (i32.const 2880) (i32.const 60000) (i32.const 2624)))
    (loop $forever (call $notify_progress (local.get $msg)) (br $forever))
    (i32.const 0))
)
