;; hostilestart: a servlet plugin whose start function (the module's start
;; section, which runs on every instantiation) never returns. Loading it
;; must fail once the call timeout stops the start function, with an error
;; saying so; nothing else may wait on it.
;;
;; Build: wat2wasm hostilestart.wat -o hostilestart.wasm (make testplugins)
(module
  (memory (export "memory") 1)
  (func $forever (loop $spin (br $spin)))
  (start $forever)
  (func (export "describe") (result i32) (i32.const 0))
  (func (export "call") (result i32) (i32.const 0))
)
