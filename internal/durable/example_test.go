package durable_test

import (
	"context"
	"fmt"

	"github.com/wasmtools/wasmtools/internal/durable"
	"github.com/wasmtools/wasmtools/internal/sessions"
	"github.com/wasmtools/wasmtools/internal/statestore"
)

// Two replicas share a store. Whichever a request reaches claims the
// session; the fence its session layer seeds the client under moves with
// every change of hands, so an instance of the old holder can no longer
// write.
func Example() {
	ctx := context.Background()
	store := statestore.NewMemory()
	replica := func(name string) (*durable.Keeper, *sessions.Manager) {
		ses := sessions.New(&sessions.Options{})
		return durable.New(durable.Options{Store: store, Sessions: ses, Replica: name}), ses
	}
	a, sesA := replica("a")
	b, sesB := replica("b")
	defer sesA.Close(ctx)
	defer sesB.Close(ctx)

	key := sessions.Client("alice")
	_, err := a.BeforeCall(ctx, key)
	fmt.Println("a claims:", err)
	_, err = b.BeforeCall(ctx, key)
	fmt.Println("b takes over:", err, sesB.Fence(key) > sesA.Fence(key))
	_, err = a.BeforeCall(ctx, key)
	fmt.Println("a takes it back:", err, sesA.Fence(key) > sesB.Fence(key))
	// Output:
	// a claims: <nil>
	// b takes over: <nil> true
	// a takes it back: <nil> true
}

// A session that cannot outlive its process has no record.
func ExampleStoreID() {
	fmt.Printf("%q\n", durable.StoreID(sessions.Handle("h1", "h1")))
	fmt.Printf("%q\n", durable.StoreID(sessions.Conn(new(int), durable.LocalPrefix+"1", durable.LocalPrefix+"1")))
	// Output:
	// "h.h1"
	// ""
}
