package statestore

import (
	"context"
	"testing"
	"time"
)

// TestDeadlineOnly: Detach's mark holds through WithTimeout and values,
// and is lost by anything that could cancel the context sooner.
func TestDeadlineOnly(t *testing.T) {
	type key struct{}
	bg := context.Background()
	detached := Detach(bg)
	timed, cancel := WithTimeout(detached, time.Minute)
	defer cancel()
	cancellable, cancel2 := context.WithCancel(timed)
	defer cancel2()
	stdTimed, cancel3 := context.WithTimeout(detached, time.Minute)
	defer cancel3()
	plainTimed, cancel4 := WithTimeout(bg, time.Minute)
	defer cancel4()
	for _, c := range []struct {
		name string
		ctx  context.Context
		want bool
	}{
		{"background", bg, false},
		{"detached", detached, true},
		{"detached, cancellable parent", Detach(cancellable), true},
		{"WithTimeout of detached", timed, true},
		{"a value under it", context.WithValue(timed, key{}, 1), true},
		{"WithTimeout twice", func() context.Context { c, _ := WithTimeout(timed, time.Second); return c }(), true},
		{"context.WithCancel of it", cancellable, false},
		{"context.WithTimeout of detached", stdTimed, false},
		{"WithTimeout of a cancellable context", plainTimed, false},
		{"WithTimeout under context.WithCancel", func() context.Context { c, _ := WithTimeout(cancellable, time.Second); return c }(), false},
	} {
		if got := deadlineOnly(c.ctx); got != c.want {
			t.Errorf("%s: deadlineOnly = %v, want %v", c.name, got, c.want)
		}
	}
}
