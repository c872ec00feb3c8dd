//go:build wasip1

// Package handoff lets a Go plugin keep its sessions' state across a hot
// swap: importing it exports the state handoff pair (wasmtools_snapshot and
// wasmtools_restore), and Register says how to save and load the state.
// When both the old and the new version of a plugin do this, the host
// moves each session's state from the old instance to a new one.
//
//	func init() {
//		handoff.Register("notes/v1",
//			func() (any, error) { return notes, nil },
//			func(format string, state json.RawMessage) error {
//				return json.Unmarshal(state, &notes)
//			})
//	}
//
// A restore that returns an error (a format it does not know, say) leaves
// the session with a fresh instance, and the client is told its state was
// reset.
package handoff

import (
	"encoding/json"
	"errors"

	"github.com/wasmtools/wasmtools/abi"
	"github.com/wasmtools/wasmtools/abi/guest"
)

var (
	format string
	save   func() (any, error)
	load   func(format string, state json.RawMessage) error
)

// Register sets the format name of the state this version saves, and how
// to save and load it. load gets the format the old version saved.
func Register(stateFormat string, saveState func() (any, error), loadState func(format string, state json.RawMessage) error) {
	format, save, load = stateFormat, saveState, loadState
}

//go:wasmexport wasmtools_snapshot
func snapshot() int32 {
	if save == nil {
		guest.SetError("handoff: no state registered")
		return 1
	}
	v, err := save()
	if err == nil {
		var b []byte
		if b, err = json.Marshal(v); err == nil {
			b, err = json.Marshal(abi.Snapshot{Format: format, State: b})
			if err == nil {
				guest.Output(b)
				return 0
			}
		}
	}
	guest.SetError("handoff: snapshot: " + err.Error())
	return 1
}

//go:wasmexport wasmtools_restore
func restore() int32 {
	var s abi.Snapshot
	err := json.Unmarshal(guest.Input(), &s)
	if err == nil && load == nil {
		err = errors.New("no state registered")
	}
	if err == nil {
		err = load(s.Format, s.State)
	}
	if err != nil {
		guest.SetError("handoff: restore: " + err.Error())
		return 1
	}
	return 0
}
