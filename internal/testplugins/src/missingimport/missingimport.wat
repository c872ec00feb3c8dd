;; missingimport: a servlet plugin importing a host function no host
;; provides. Loading it must fail with an error naming the import.
(module
  (import "extism:host/user" "launch_missiles" (func (param i64) (result i64)))
  (memory (export "memory") 1)
  (func (export "describe") (result i32) (i32.const 0))
  (func (export "call") (result i32) (i32.const 0))
)
