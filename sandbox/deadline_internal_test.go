package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tetratelabs/wazero/api"
)

// fakeGlobal stands for a guest's mutable global.
type fakeGlobal struct {
	api.MutableGlobal // the rest, unused
	v                 atomic.Uint64
}

func (g *fakeGlobal) Get() uint64  { return g.v.Load() }
func (g *fakeGlobal) Set(v uint64) { g.v.Store(v) }

// TestDeadlineReused holds an instance's reused deadline to its call: a
// firing whose time is not up (one left over from the call before) ends
// nothing, nor does one while the call waits for a person (pauses nest),
// whose wait does not count; a call whose time ran out as it paused ends
// at the pause; a disarmed deadline ends nothing.
//
// The guest's interrupt flag is set with the call's end, and only then
// (the deadline sets it itself, issue 27 item 2).
func TestDeadlineReused(t *testing.T) {
	var dl deadline
	var flag, budget fakeGlobal
	intr := newInterrupter(&flag, &budget)
	arm := func() context.Context {
		ctx, cancel := context.WithCancelCause(context.Background())
		t.Cleanup(func() { cancel(nil) })
		flag.Set(0)
		budget.Set(1)
		dl.arm(time.Hour, cancel, intr)
		return ctx
	}
	expire := func() { // as if the call had run past its timeout
		dl.mu.Lock()
		dl.start = dl.start.Add(-2 * time.Hour)
		dl.mu.Unlock()
	}
	ended := func(ctx context.Context) bool {
		done := errors.Is(context.Cause(ctx), context.DeadlineExceeded)
		if set := flag.Get() == 1 && budget.Get() == 0; set != done {
			t.Fatalf("the call ended: %v, but its guest's flag set: %v", done, set)
		}
		return done
	}

	ctx := arm()
	dl.fire() // a firing of the call before
	if ended(ctx) {
		t.Fatal("a firing before the call's time was up ended it")
	}
	expire()
	dl.fire()
	if !ended(ctx) {
		t.Fatal("the call's time was up and its firing did not end it")
	}
	dl.stop()

	ctx = arm()
	dl.pause()
	expire()
	dl.fire()
	if ended(ctx) {
		t.Fatal("a firing ended a call waiting for a person")
	}
	dl.resume()
	if ended(ctx) {
		t.Fatal("the time a call waited for a person counted")
	}
	expire()
	dl.fire()
	if !ended(ctx) {
		t.Fatal("the call's time was up after it resumed and its firing did not end it")
	}
	dl.stop()

	ctx = arm()
	expire()
	dl.pause() // its firing, if any, waits for the lock and will find it paused
	if !ended(ctx) {
		t.Fatal("a call whose time ran out as it paused was not ended at the pause")
	}
	dl.resume()
	dl.stop()

	ctx = arm()
	dl.pause()
	dl.pause()
	dl.resume() // nested: still paused
	expire()
	dl.fire()
	if ended(ctx) {
		t.Fatal("a firing ended a call still paused by an outer pause")
	}
	dl.resume()
	expire()
	dl.fire()
	if !ended(ctx) {
		t.Fatal("the call's time was up after the outer resume and its firing did not end it")
	}
	dl.stop()

	ctx = arm()
	dl.stop()
	expire()
	dl.fire()
	if ended(ctx) {
		t.Fatal("a disarmed deadline ended its call")
	}

	// A resume that no pause matches gives the call no time back.
	ctx = arm()
	expire()
	dl.resume()
	dl.fire()
	if !ended(ctx) {
		t.Fatal("an unmatched resume restarted the call's clock")
	}
	dl.stop()
}

// TestPauseDeadline: PauseDeadline pauses the deadline of the call whose
// context it is given, until its resume, and nothing outside a call.
func TestPauseDeadline(t *testing.T) {
	PauseDeadline(context.Background())() // no call: nothing to pause
	i := &Instance{}
	i.deadline = &i.dl
	ctx, cancel := context.WithCancelCause(context.WithValue(context.Background(), instanceKey{}, i))
	defer cancel(nil)
	i.dl.arm(time.Hour, cancel, nil)
	defer i.dl.stop()
	expire := func() { // as if the call had run past its timeout
		i.dl.mu.Lock()
		i.dl.start = i.dl.start.Add(-2 * time.Hour)
		i.dl.mu.Unlock()
	}
	resume := PauseDeadline(ctx)
	expire()
	i.dl.fire()
	if ctx.Err() != nil {
		t.Fatal("a firing ended a call paused by PauseDeadline")
	}
	resume()
	if ctx.Err() != nil {
		t.Fatal("the paused time counted")
	}
	expire()
	i.dl.fire()
	if !errors.Is(context.Cause(ctx), context.DeadlineExceeded) {
		t.Fatal("the call's time was up after PauseDeadline's resume, and its firing did not end it")
	}
}
