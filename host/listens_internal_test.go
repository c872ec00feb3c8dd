package host

import "testing"

// TestListenBookBytes: past a tenant's quarter of listenBytes its next
// listen is refused, another tenant's taken, and past listenBytes in all
// everyone's refused; a released stream gives its bytes back.
func TestListenBookBytes(t *testing.T) {
	b := newListenBook(&Options{Tenants: true})
	const uris = 5 << 20 // more than any one listen holds: the bound is in bytes
	var releases []func()
	for i := range 3 {
		r, err := b.take("bob", uris)
		if err != nil {
			t.Fatalf("bob's listen %d: %v", i+1, err)
		}
		releases = append(releases, r)
	}
	if _, err := b.take("bob", uris); err == nil {
		t.Fatalf("bob's fourth listen of 5 MiB, past his 16 MiB: taken")
	}
	for _, who := range []string{"alice", "carol", "dave"} {
		for i := range 3 {
			if _, err := b.take(who, uris); err != nil {
				t.Fatalf("%s's listen %d: %v", who, i+1, err)
			}
		}
	}
	if _, err := b.take("erin", uris); err == nil {
		t.Fatalf("erin's listen past %d bytes in all: taken", listenBytes)
	}
	releases[0]()
	releases[0]() // idempotent
	if _, err := b.take("bob", uris); err != nil {
		t.Errorf("bob's listen after he closed one: %v", err)
	}
	if b.open != 12 {
		t.Errorf("%d streams booked, want 12", b.open)
	}
}
