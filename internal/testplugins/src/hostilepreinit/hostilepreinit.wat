;; hostilepreinit: a pre-initialisation export (wizer.initialize) that
;; never returns: the instance's initialisation deadline stops it, and the
;; plugin fails to load, naming the export.
;;
;; Build: wat2wasm hostilepreinit.wat -o hostilepreinit.wasm
(module
  (import "extism:host/env" "alloc" (func $alloc (param i64) (result i64)))
  (import "extism:host/env" "store_u8" (func $store_u8 (param i64 i32)))
  (import "extism:host/env" "output_set" (func $output_set (param i64 i64)))

  (memory (export "memory") 1)

  ;; The describe output, at 0.
  (data (i32.const 0) "{\"tools\":[{\"name\":\"count\",\"description\":\"Adds one to this session's counter and returns it. Each client counts on its own.\",\"inputSchema\":{\"type\":\"object\",\"properties\":{}}}]}")
  ;; The call result around the number, at 1024 and 1100.
  (data (i32.const 1024) "{\"content\":[{\"type\":\"text\",\"text\":\"")
  (data (i32.const 1100) "\"}]}")

  (global $count (mut i64) (i64.const 0))

  ;; emit copies len bytes at ptr of linear memory into a new Extism block
  ;; and makes it the output.
  (func $emit (param $ptr i32) (param $len i32)
    (local $off i64) (local $i i32)
    (local.set $off (call $alloc (i64.extend_i32_u (local.get $len))))
    (block $done
      (loop $copy
        (br_if $done (i32.ge_u (local.get $i) (local.get $len)))
        (call $store_u8
          (i64.add (local.get $off) (i64.extend_i32_u (local.get $i)))
          (i32.load8_u (i32.add (local.get $ptr) (local.get $i))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $copy)))
    (call $output_set (local.get $off) (i64.extend_i32_u (local.get $len))))

  (func (export "describe") (result i32)
    (call $emit (i32.const 0) (i32.const 174))
    (i32.const 0))

  ;; call ignores its input: the one tool takes no arguments.
  (func (export "call") (result i32)
    (local $n i64) (local $p i32) (local $digits i32) (local $q i32)
    (global.set $count (i64.add (global.get $count) (i64.const 1)))
    ;; Write the digits backwards from 2047, then assemble at 2048:
    ;; prefix (35 bytes), digits, suffix (4 bytes).
    (local.set $n (global.get $count))
    (local.set $p (i32.const 2047))
    (loop $digit
      (i32.store8 (local.get $p)
        (i32.add (i32.const 48) (i32.wrap_i64 (i64.rem_u (local.get $n) (i64.const 10)))))
      (local.set $p (i32.sub (local.get $p) (i32.const 1)))
      (local.set $digits (i32.add (local.get $digits) (i32.const 1)))
      (local.set $n (i64.div_u (local.get $n) (i64.const 10)))
      (br_if $digit (i64.ne (local.get $n) (i64.const 0))))
    (memory.copy (i32.const 2048) (i32.const 1024) (i32.const 35))
    (memory.copy (i32.const 2083) (i32.add (local.get $p) (i32.const 1)) (local.get $digits))
    (local.set $q (i32.add (i32.const 2083) (local.get $digits)))
    (memory.copy (local.get $q) (i32.const 1100) (i32.const 4))
    (call $emit (i32.const 2048) (i32.add (i32.const 39) (local.get $digits)))
    (i32.const 0))
  (func (export "wizer.initialize")
    (loop $forever (br $forever)))
)
