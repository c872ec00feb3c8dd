;; hostilebigmin: a servlet plugin whose memory's minimum, 1025 pages
;; (64 MiB and 64 KiB), is over the default 64 MiB memory limit. It must
;; fail to load, before any of its code runs, with an error giving both.
;;
;; Build: wat2wasm hostilebigmin.wat -o hostilebigmin.wasm (make testplugins)
(module
  (memory (export "memory") 1025)
  (func (export "describe") (result i32) (i32.const 0))
  (func (export "call") (result i32) (i32.const 0))
)
