;; hostileinit: a servlet plugin whose _initialize export (what a WASI
;; reactor runs once per instance) never returns. Loading it must fail once
;; the call timeout stops it, with an error saying so.
;;
;; Build: wat2wasm hostileinit.wat -o hostileinit.wasm (make testplugins)
(module
  (memory (export "memory") 1)
  (func (export "_initialize") (loop $spin (br $spin)))
  (func (export "describe") (result i32) (i32.const 0))
  (func (export "call") (result i32) (i32.const 0))
)
