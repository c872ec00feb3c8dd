package statestore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/wasmtools/wasmtools/internal/statestore"
)

// A replica claims a session, writes its state, and another replica takes
// the session over when the first has left: the first's late write is
// fenced.
func ExampleOpen() {
	dir, _ := os.MkdirTemp("", "statestore")
	defer os.RemoveAll(dir)
	s, err := statestore.Open("file:"+filepath.Join(dir, "sessions.db"), []byte("the replicas' shared state key"))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer s.Close()
	ctx := context.Background()
	s1 := statestore.Owner{Replica: "s1", Boot: "boot-1"}
	s2 := statestore.Owner{Replica: "s2", Boot: "boot-2"}
	s.Heartbeat(ctx, s1, 30*time.Second)
	s.Heartbeat(ctx, s2, 30*time.Second)

	c1, _ := s.Claim(ctx, "s1.abc", s1, time.Hour, false)
	s.Put(ctx, "s1.abc", "counter", []byte("41"), c1.Fence, time.Hour)

	s.Leave(ctx, s1) // s1 drained
	c2, _ := s.Claim(ctx, "s1.abc", s2, time.Hour, false)
	fmt.Println("taken from", c2.Previous.Replica, "with the next fence:", c2.Fence == c1.Fence+1)
	rec, _ := s.Get(ctx, "s1.abc")
	fmt.Println("counter", string(rec["counter"]))

	err = s.Put(ctx, "s1.abc", "counter", []byte("lost"), c1.Fence, time.Hour)
	fmt.Println(errors.Is(err, statestore.ErrFenced))
	// Output:
	// taken from s1 with the next fence: true
	// counter 41
	// true
}
