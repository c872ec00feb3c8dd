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
	stdDeadline, cancel5 := context.WithDeadline(timed, time.Now().Add(time.Second))
	defer cancel5()
	causeCancel, cancel6 := context.WithCancelCause(timed)
	defer cancel6(nil)
	twice, cancel7 := WithTimeout(timed, time.Second)
	defer cancel7()
	under, cancel8 := WithTimeout(cancellable, time.Second)
	defer cancel8()
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
		{"WithTimeout twice", twice, true},
		{"Detach of a timed context", Detach(plainTimed), true},
		{"context.WithCancel of it", cancellable, false},
		{"context.WithTimeout of detached", stdTimed, false},
		{"WithTimeout of a cancellable context", plainTimed, false},
		{"WithTimeout under context.WithCancel", under, false},
		{"context.WithDeadline of it", stdDeadline, false},
		{"context.WithCancelCause of it", causeCancel, false},
		{"context.WithoutCancel of a timed context", context.WithoutCancel(plainTimed), false},
	} {
		if got := DeadlineOnly(c.ctx); got != c.want {
			t.Errorf("%s: DeadlineOnly = %v, want %v", c.name, got, c.want)
		}
	}
}
