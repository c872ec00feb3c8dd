package main

import (
	"runtime/debug"
	"sync"
)

// version is what the server reports to clients and `wasmtools version`
// prints, computed once from the binary's build info.
var version = sync.OnceValue(func() string {
	info, _ := debug.ReadBuildInfo()
	return versionOf(info)
})

// versionOf is the main module's version when the go command knew it
// (`go install …@v1.2.3`), else the VCS revision the binary was built from,
// shortened as in pseudo-versions and marked "-dirty" when the tree had
// changes, else "devel" (no build info, or built with -buildvcs=false).
func versionOf(info *debug.BuildInfo) string {
	if info == nil {
		return "devel"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	var rev string
	var dirty bool
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	if rev == "" {
		return "devel"
	}
	rev = rev[:min(len(rev), 12)]
	if dirty {
		rev += "-dirty"
	}
	return rev
}
