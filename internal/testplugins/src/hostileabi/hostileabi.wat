;; hostileabi: a servlet plugin with one tool per misuse of a host function:
;; out-of-bounds offsets, huge lengths, offsets that wrap around 2^64,
;; input over the 1 MiB limit, invalid UTF-8 and invalid JSON, passed to
;; every function of the Extism kernel (extism:host/env) and to the MCP
;; host functions (extism:host/user) but create_elicitation (see
;; hostileelicit, since importing it changes how the host runs calls).
;; Tool "abi_ok" works, so a test can see the plugin recover after each.
;;
;; host/hostile_test.go drives it; docs/SECURITY.md says what each case
;; proves. A tool expected to trap ends, if the host lets it through, with
;; the text "no trap", which the test refuses.
;;
;; Build: wat2wasm hostileabi.wat -o hostileabi.wasm (make testplugins)
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "free" (func $free (param i64)))
  (import "extism:host/env" "length" (func $length (param i64) (result i64)))
  (import "extism:host/env" "length_unsafe" (func $length_unsafe (param i64) (result i64)))
  (import "extism:host/env" "load_u8" (func $load_u8 (param i64) (result i32)))
  (import "extism:host/env" "load_u64" (func $load_u64 (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "store_u64" (func $store_u64 (param i64 i64)))
  (import "extism:host/env" "input_length" (func $input_length (result i64)))
  (import "extism:host/env" "input_offset" (func $input_offset (result i64)))
  (import "extism:host/env" "input_load_u8" (func $input_load_u8 (param i64) (result i32)))
  (import "extism:host/env" "input_load_u64" (func $input_load_u64 (param i64) (result i64)))
  (import "extism:host/env" "input_set" (func $input_set (param i64 i64)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))
  (import "extism:host/env" "error_set" (func $error_set (param i64)))
  (import "extism:host/env" "config_get" (func $config_get (param i64) (result i64)))
  (import "extism:host/env" "var_get" (func $var_get (param i64) (result i64)))
  (import "extism:host/env" "var_set" (func $var_set (param i64 i64)))
  (import "extism:host/env" "log_trace" (func $log_trace (param i64)))
  (import "extism:host/env" "log_debug" (func $log_debug (param i64)))
  (import "extism:host/env" "log_info" (func $log_info (param i64)))
  (import "extism:host/env" "log_warn" (func $log_warn (param i64)))
  (import "extism:host/env" "log_error" (func $log_error (param i64)))
  (import "extism:host/user" "notify_progress" (func $notify_progress (param i64)))
  (import "extism:host/user" "notify_logging_message" (func $notify_logging_message (param i64)))
  (import "extism:host/user" "write_record" (func $write_record (param i64) (result i64)))
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

  ;; Texts and host-function inputs.
  (data (i32.const 2048) "ok")
  (data (i32.const 2064) "no trap")
  (data (i32.const 2080) "length of a bad offset is 0")
  (data (i32.const 2112) "free of bad offsets is ignored")
  (data (i32.const 2144) "alloc(-1) returned a block")
  (data (i32.const 2176) "input read after its block was freed")
  (data (i32.const 2240) "record kept")
  (data (i32.const 2304) "\ff\fe is not UTF-8")
  (data (i32.const 2336) "{\"progress\":")
  (data (i32.const 2368) "{\"level\":\"loud\",\"data\":1}")
  (data (i32.const 2400) "key")

  ;; The tools, in the order of the table below.
  (data (i32.const 4096)
    "abi_ok\00"
    "load_u8_huge\00load_u8_zero\00load_u64_straddle\00load_u64_wrap\00"
    "store_u8_huge\00store_u64_wrap\00"
    "input_load_u8_huge\00input_load_u64_wrap\00input_set_huge\00"
    "output_set_huge_len\00output_set_huge_off\00output_set_wrap\00"
    "error_set_huge\00error_set_inside\00"
    "length_huge\00free_huge\00"
    "config_get_huge\00var_get_huge\00var_set_huge_key\00var_set_huge_value\00var_set_over\00"
    "log_trace_huge\00log_debug_huge\00log_info_huge\00log_warn_huge\00log_error_huge\00"
    "alloc_huge\00alloc_wrap\00alloc_wrap_error_set\00alloc_wrap_log\00alloc_wrap_notify\00"
    "input_freed_load\00"
    "notify_progress_huge\00notify_logging_message_huge\00write_record_huge\00notify_resource_updated_huge\00"
    "notify_progress_over\00"
    "notify_progress_utf8\00notify_logging_message_utf8\00write_record_utf8\00notify_resource_updated_utf8\00"
    "notify_progress_json\00notify_logging_message_json\00notify_logging_message_level\00write_record_json\00notify_resource_updated_json\00")
  (table funcref (elem
    $ok
    $load_u8_huge $load_u8_zero $load_u64_straddle $load_u64_wrap
    $store_u8_huge $store_u64_wrap
    $input_load_u8_huge $input_load_u64_wrap $input_set_huge
    $output_set_huge_len $output_set_huge_off $output_set_wrap
    $error_set_huge $error_set_inside
    $length_huge $free_huge
    $config_get_huge $var_get_huge $var_set_huge_key $var_set_huge_value $var_set_over
    $log_trace_huge $log_debug_huge $log_info_huge $log_warn_huge $log_error_huge
    $alloc_huge $alloc_wrap $alloc_wrap_error_set $alloc_wrap_log $alloc_wrap_notify
    $input_freed_load
    $notify_progress_huge $notify_logging_message_huge $write_record_huge $notify_resource_updated_huge
    $notify_progress_over
    $notify_progress_utf8 $notify_logging_message_utf8 $write_record_utf8 $notify_resource_updated_utf8
    $notify_progress_json $notify_logging_message_json $notify_logging_message_level $write_record_json $notify_resource_updated_json))

  ;; An offset far outside any kernel memory, and a length past every limit.
  (global $huge i64 (i64.const 0x7ffffffffffffff0))

  ;; $no_trap ends a tool that should have trapped.
  (func $no_trap (result i32) (call $text (i32.const 2064)) (i32.const 0))

  (func $ok (type $tool) (call $text (i32.const 2048)) (i32.const 0))

  ;; Kernel loads and stores outside kernel memory.
  (func $load_u8_huge (type $tool)
    (drop (call $load_u8 (global.get $huge))) (call $no_trap))
  (func $load_u8_zero (type $tool)
    (drop (call $load_u8 (i64.const 0))) (call $no_trap))
  (func $load_u64_straddle (type $tool)
    (drop (call $load_u64 (i64.add (call $alloc (i64.const 8)) (i64.const 4)))) (call $no_trap))
  (func $load_u64_wrap (type $tool)
    (drop (call $load_u64 (i64.const -1))) (call $no_trap))
  (func $store_u8_huge (type $tool)
    (call $store_u8 (global.get $huge) (i32.const 1)) (call $no_trap))
  (func $store_u64_wrap (type $tool)
    (call $store_u64 (i64.const -8) (i64.const 1)) (call $no_trap))

  ;; Input reads past its end, and an input set outside kernel memory.
  (func $input_load_u8_huge (type $tool)
    (drop (call $input_load_u8 (global.get $huge))) (call $no_trap))
  (func $input_load_u64_wrap (type $tool)
    (drop (call $input_load_u64 (i64.const -4))) (call $no_trap))
  (func $input_set_huge (type $tool)
    (call $input_set (global.get $huge) (i64.const 16)) (call $no_trap))

  ;; Outputs over the limit or outside kernel memory.
  (func $output_set_huge_len (type $tool)
    (call $output_set (call $alloc (i64.const 8)) (i64.const -1)) (call $no_trap))
  (func $output_set_huge_off (type $tool)
    (call $output_set (global.get $huge) (i64.const 16)) (call $no_trap))
  (func $output_set_wrap (type $tool)
    (call $output_set (i64.const -8) (i64.const 16)) (call $no_trap))

  ;; Error messages that are not live blocks.
  (func $error_set_huge (type $tool)
    (call $error_set (global.get $huge)) (i32.const 1))
  (func $error_set_inside (type $tool)
    (call $error_set (i64.add (call $alloc (i64.const 16)) (i64.const 8))) (i32.const 1))

  ;; Functions that must shrug off bad offsets.
  (func $length_huge (type $tool)
    (if (i64.ne (call $length (global.get $huge)) (i64.const 0)) (then unreachable))
    (if (i64.ne (call $length_unsafe (i64.const -1)) (i64.const 0)) (then unreachable))
    (if (i64.ne (call $length (i64.const 0)) (i64.const 0)) (then unreachable))
    (call $text (i32.const 2080)) (i32.const 0))
  (func $free_huge (type $tool)
    (local $off i64)
    (call $free (global.get $huge))
    (call $free (i64.const -1))
    (call $free (i64.const 0))
    (local.set $off (call $alloc (i64.const 8)))
    (call $free (local.get $off))
    (call $free (local.get $off))
    (call $text (i32.const 2112)) (i32.const 0))

  ;; Config and vars with keys and values that are not live blocks, and
  ;; vars over their 1 MiB limit.
  (func $config_get_huge (type $tool)
    (drop (call $config_get (global.get $huge))) (call $no_trap))
  (func $var_get_huge (type $tool)
    (drop (call $var_get (global.get $huge))) (call $no_trap))
  (func $var_set_huge_key (type $tool)
    (call $var_set (global.get $huge) (i64.const 0)) (call $no_trap))
  (func $var_set_huge_value (type $tool)
    (call $var_set (call $cblock (i32.const 2400)) (global.get $huge)) (call $no_trap))
  (func $var_set_over (type $tool)
    (local $i i64) (local $key i64) (local $value i64)
    (local.set $value (call $alloc (i64.const 262144)))
    (loop $more
      (local.set $key (call $alloc (i64.const 8)))
      (call $store_u64 (local.get $key) (local.get $i))
      (call $var_set (local.get $key) (local.get $value))
      (local.set $i (i64.add (local.get $i) (i64.const 1)))
      (br_if $more (i64.lt_u (local.get $i) (i64.const 64))))
    (call $no_trap))

  ;; Log messages that are not live blocks.
  (func $log_trace_huge (type $tool) (call $log_trace (global.get $huge)) (call $no_trap))
  (func $log_debug_huge (type $tool) (call $log_debug (global.get $huge)) (call $no_trap))
  (func $log_info_huge (type $tool) (call $log_info (global.get $huge)) (call $no_trap))
  (func $log_warn_huge (type $tool) (call $log_warn (global.get $huge)) (call $no_trap))
  (func $log_error_huge (type $tool) (call $log_error (global.get $huge)) (call $no_trap))

  ;; Allocations past the kernel memory limit, and one whose length wraps
  ;; around 2^64 (alloc(-1)), used afterwards as an error message, a log
  ;; message and a host-function input.
  (func $alloc_huge (type $tool)
    (drop (call $alloc (global.get $huge))) (call $no_trap))
  (func $alloc_wrap (type $tool)
    (if (i64.eqz (call $alloc (i64.const -1))) (then unreachable))
    (call $text (i32.const 2144)) (i32.const 0))
  (func $alloc_wrap_error_set (type $tool)
    (call $error_set (call $alloc (i64.const -1))) (i32.const 1))
  (func $alloc_wrap_log (type $tool)
    (call $log_info (call $alloc (i64.const -1))) (call $no_trap))
  (func $alloc_wrap_notify (type $tool)
    (call $notify_progress (call $alloc (i64.const -1))) (call $no_trap))

  ;; The input read after the guest freed its block (the last block, so
  ;; kernel memory shrinks under it).
  (func $input_freed_load (type $tool)
    (call $free (call $input_offset))
    (drop (call $input_load_u8 (i64.const 0)))
    (call $text (i32.const 2176)) (i32.const 0))

  ;; MCP host functions given offsets that are not live blocks.
  (func $notify_progress_huge (type $tool)
    (call $notify_progress (global.get $huge)) (call $no_trap))
  (func $notify_logging_message_huge (type $tool)
    (call $notify_logging_message (global.get $huge)) (call $no_trap))
  (func $write_record_huge (type $tool)
    (drop (call $write_record (global.get $huge))) (call $no_trap))
  (func $notify_resource_updated_huge (type $tool)
    (call $notify_resource_updated (global.get $huge)) (call $no_trap))

  ;; An input one byte over the 1 MiB limit.
  (func $notify_progress_over (type $tool)
    (call $notify_progress (call $alloc (i64.const 1048577))) (call $no_trap))

  ;; Invalid UTF-8.
  (func $notify_progress_utf8 (type $tool)
    (call $notify_progress (call $cblock (i32.const 2304))) (call $no_trap))
  (func $notify_logging_message_utf8 (type $tool)
    (call $notify_logging_message (call $cblock (i32.const 2304))) (call $no_trap))
  (func $write_record_utf8 (type $tool)
    (drop (call $write_record (call $cblock (i32.const 2304)))) (call $no_trap))
  (func $notify_resource_updated_utf8 (type $tool)
    (call $notify_resource_updated (call $cblock (i32.const 2304))) (call $no_trap))

  ;; Invalid JSON (cut short), and a log message of an unknown level.
  (func $notify_progress_json (type $tool)
    (call $notify_progress (call $cblock (i32.const 2336))) (call $no_trap))
  (func $notify_logging_message_json (type $tool)
    (call $notify_logging_message (call $cblock (i32.const 2336))) (call $no_trap))
  (func $notify_logging_message_level (type $tool)
    (call $notify_logging_message (call $cblock (i32.const 2368))) (call $no_trap))
  ;; write_record answers with the offset of its reason: make it the error.
  (func $write_record_json (type $tool)
    (local $r i64)
    (local.set $r (call $write_record (call $cblock (i32.const 2336))))
    (if (i64.eqz (local.get $r)) (then (call $text (i32.const 2240)) (return (i32.const 0))))
    (call $error_set (local.get $r)) (i32.const 1))
  (func $notify_resource_updated_json (type $tool)
    (call $notify_resource_updated (call $cblock (i32.const 2336))) (call $no_trap))
)
