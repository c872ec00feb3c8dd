package sandbox

import (
	"testing"
	"time"
)

// TestTrackChoice: an instance tracks its writes once its own figures say
// that tracking would cost less than hashing what it owns, by half again,
// where tracking a guest that writes the same pieces at every call costs
// about twice hashing them, however dear a fault (the rent-or-buy rule
// takes the faults once in a while); it stops once its tracked snapshots
// have cost more than hashing would have by trackBudget snapshots' worth,
// not at one burst of faults; and after stopping it waits, longer each
// time, before it tracks again. What hashing a piece costs is the least a
// snapshot measured, not one after the memory grew or of few pieces, and
// hashing's cost includes finding the pieces owned.
func TestTrackChoice(t *testing.T) {
	const (
		write = 15 * time.Microsecond // a fault, as in the VMs seen here
		hash  = 90 * time.Nanosecond  // hashing a piece in the cache
	)
	owned := func(n int) []uint64 {
		b := make([]uint64, (n+63)/64+1)
		for p := range n {
			b[p/64] |= 1 << (p % 64)
		}
		return b
	}
	hashing := func(n, changed int, took time.Duration) snapshotFigures {
		return snapshotFigures{ownedKnown: true, written: owned(n), changed: changed, hashed: n, hashTime: took}
	}
	// A tracked snapshot that found n pieces written, each of which
	// faulted (its scan protects), hashed at 200 ns each.
	tracking := func(n int) snapshotFigures {
		return snapshotFigures{tracked: true, written: owned(n), protected: true, hashed: n, hashTime: time.Duration(n) * 200 * time.Nanosecond}
	}

	// Too few pieces hashed to time them: the process's figure stands.
	c := trackChoice{chosen: true}
	c.take(hashing(100, 20, 20*time.Microsecond), write, hash)
	if c.hashNs != 0 {
		t.Fatalf("after 100 pieces hashed: %+v", c)
	}
	// A snapshot after growth measures nothing; a faster one lowers it.
	c = trackChoice{chosen: true}
	c.take(snapshotFigures{ownedKnown: true, written: owned(200), changed: 150, grew: true, hashed: 200, hashTime: time.Millisecond}, write, hash)
	if c.hashNs != 0 {
		t.Fatalf("measured after growth: %+v", c)
	}
	c.take(hashing(200, 150, 30*time.Microsecond), write, hash)
	c.take(hashing(200, 150, 60*time.Microsecond), write, hash)
	if c.hashNs != 150 {
		t.Fatalf("hashNs %v, want the least, 150", c.hashNs)
	}
	// 150 of its 200 pieces changed at each call: tracking them (300
	// ns each, twice their hashing) is 45 µs against 30 µs of hashing.
	if c.on {
		t.Fatalf("tracking a guest that changes most of what it owns: %+v", c)
	}

	// A Go guest: 200 pieces owned, 20 changed at each call. Its
	// faults cost 300 µs a call, but come about once in 100 snapshots
	// (the rent-or-buy rule: 3 µs of hashing them a snapshot); hashing
	// the 20 pieces costs 6 µs against 30 µs for the 200.
	c = trackChoice{chosen: true}
	c.take(hashing(200, 20, 30*time.Microsecond), write, hash)
	if !c.chosen || !c.on {
		t.Fatalf("a guest that writes 20 of 200 pieces does not track: %+v", c)
	}
	// Finding the pieces it owns is part of hashing's cost: 80 of 200
	// changed (24 µs tracked) is not 1.5 times under 30 µs of hashing,
	// but is under 30 µs more of reading pagemap.
	c = trackChoice{chosen: true}
	c.take(hashing(200, 80, 30*time.Microsecond), write, hash)
	if c.on {
		t.Fatalf("tracking 80 of 200 pieces changed: %+v", c)
	}
	c = trackChoice{chosen: true}
	f := hashing(200, 80, 30*time.Microsecond)
	f.ownScanTime = 30 * time.Microsecond
	c.take(f, write, hash)
	if !c.on {
		t.Fatalf("not tracking 80 of 200 pieces changed, with 30 µs to read pagemap: %+v", c)
	}

	// Where a fault costs less than hashing a piece twice (100 ns
	// against 150), tracking costs a fault a piece: 150 of 200 changed
	// is 15 µs against 30 µs of hashing.
	c = trackChoice{chosen: true}
	c.take(hashing(200, 150, 30*time.Microsecond), 100*time.Nanosecond, hash)
	if !c.on {
		t.Fatalf("not tracking 150 of 200 pieces with faults cheaper than hashing: %+v", c)
	}

	// Tracked, the pieces written add to what it owns.
	c = trackChoice{chosen: true}
	c.take(hashing(400, 20, 60*time.Microsecond), write, hash)
	if !c.on {
		t.Fatalf("not tracking at 400 owned: %+v", c)
	}
	c.take(tracking(10), write, hash)
	if got := ones(c.owned); got != 400 || !c.on {
		t.Fatalf("owned %d after 10 of its 400 written, want 400, tracking: %+v", got, c)
	}
	c.take(snapshotFigures{tracked: true, written: []uint64{0, 0, 0, 0, 0, 0, 0, 0, 1}, hashed: 1, hashTime: time.Microsecond}, write, hash)
	if got := ones(c.owned); got != 401 || !c.on {
		t.Fatalf("owned %d after piece 512 written, want 401, tracking: %+v", got, c)
	}
	// A burst of faults (100 pieces, 1.5 ms) among cheap snapshots
	// does not stop it: hashing would have cost 60 µs at every one. (Its
	// credit is capped at trackBudget snapshots' worth: a thousand
	// cheap snapshots do not keep it tracking through the costly ones
	// below.)
	for range 1000 {
		c.take(snapshotFigures{tracked: true, written: owned(1), hashed: 1, hashTime: time.Microsecond}, write, hash)
	}
	c.take(tracking(100), write, hash)
	if !c.on {
		t.Fatalf("stopped tracking at one burst of faults: %+v", c)
	}
	// It now writes most of what it owns, each piece faulting: 6.8 ms
	// a snapshot against 60 µs hashed. Tracking stops within the
	// credit it had and the budget, and waits.
	n := 0
	for ; c.on; n++ {
		if n > 3 {
			t.Fatalf("still tracking after %d snapshots costing 6.8 ms: %+v", n, c)
		}
		c.take(tracking(450), write, hash)
	}
	if c.hold != trackHoldMin {
		t.Fatalf("hold %d after tracking stopped, want %d", c.hold, trackHoldMin)
	}
	for k := range trackHoldMin {
		c.take(hashing(450, 1, 70*time.Microsecond), write, hash)
		if c.on {
			t.Fatalf("tracking again after %d snapshots of a hold of %d", k+1, trackHoldMin)
		}
	}
	for k := 0; !c.on; k++ {
		if k > 8 {
			t.Fatalf("not tracking again after the hold, writing 1 of 450: %+v", c)
		}
		c.take(hashing(450, 1, 70*time.Microsecond), write, hash)
	}
	// A new trial starts even: a cheap snapshot does not stop it for
	// what the last trial lost.
	c.take(snapshotFigures{tracked: true, written: owned(1), hashed: 1, hashTime: time.Microsecond}, write, hash)
	if !c.on {
		t.Fatalf("a new trial stopped at a cheap snapshot: %+v", c)
	}
	for c.on {
		c.take(tracking(450), write, hash)
	}
	if c.hold != 2*trackHoldMin {
		t.Fatalf("hold %d after tracking stopped twice, want %d", c.hold, 2*trackHoldMin)
	}

	// An instance that tracks from its start (where the process's
	// measurement says it pays) has no figures for hashing: it goes on
	// tracking, whatever it writes, until it has hashed once.
	c = trackChoice{chosen: true, on: true}
	for range 20 {
		c.take(tracking(20), write, hash)
		if !c.on {
			t.Fatalf("stopped tracking without knowing what it owns: %+v", c)
		}
	}

	// A guest that writes 300 pieces a snapshot but changes 2 looks
	// cheap to track while hashed: it starts again after each hold,
	// and stops once its tracked snapshots (4.56 ms each, against 70 µs
	// hashed) have cost trackBudget snapshots' hashing more, each hold
	// twice the last.
	c = trackChoice{chosen: true}
	snapshots, trial := 0, 0
	for stops := 0; stops < 4; snapshots++ {
		if snapshots > 1000 {
			t.Fatalf("after %d snapshots, %d stops: %+v", snapshots, stops, c)
		}
		if !c.on {
			c.take(hashing(450, 2, 70*time.Microsecond), write, hash)
			continue
		}
		c.take(tracking(300), write, hash)
		trial++
		if c.on {
			continue
		}
		if trial != 1 {
			t.Fatalf("tracking stopped after %d snapshots of 4.56 ms, want 1", trial)
		}
		trial = 0
		stops++
		if want := trackHoldMin << (stops - 1); c.hold != want {
			t.Fatalf("hold %d after %d stops, want %d", c.hold, stops, want)
		}
	}
	// Each stop a tracked snapshot, each start a hashed one, and the
	// holds between.
	if want := 1 + 1 + (16 + 1 + 1) + (32 + 1 + 1) + (64 + 1 + 1); snapshots != want {
		t.Fatalf("%d snapshots for 4 stops, want %d", snapshots, want)
	}

	// Where every call writes pieces it did not write before (faults
	// at every snapshot, 20 of them, 300 µs, against 300 µs of hashing
	// 2,000 pieces), tracking stops after a trial: the credit runs out.
	c = trackChoice{chosen: true}
	c.take(hashing(2000, 20, 300*time.Microsecond), write, hash)
	if !c.on {
		t.Fatalf("not trying to track 20 of 2,000: %+v", c)
	}
	for n = 0; c.on; n++ {
		if n > 10*trackBudget {
			t.Fatalf("still tracking after %d snapshots that each cost more than hashing: %+v", n, c)
		}
		f := tracking(20)
		f.written = make([]uint64, 40)
		for k := range 20 {
			p := (n*20 + k) % 2000
			f.written[p/64] |= 1 << (p % 64)
		}
		f.hashTime = 0
		f.scanTime = 50 * time.Microsecond
		c.take(f, write, hash)
	}
}

// TestProtectChoice: a tracking instance's scans protect again the pages
// they find written until what that costs is measured (the scan, and the
// faults of the pages written again after it), then leave them written
// until the hashing of pieces found written again since the last
// protecting scan reaches that cost; and a snapshot that did not track
// starts over. (That the faults the choice counts are of pieces written
// since the scan before, not since the last protecting one, is
// TestTrackChoiceKeepsGoGuest's.)
func TestProtectChoice(t *testing.T) {
	const (
		write = 1300 * time.Nanosecond
		hash  = 90 * time.Nanosecond
	)
	pieces := func(ps ...int) []uint64 {
		b := make([]uint64, 8) // 512: past 200 and the loop's 101 more
		for _, p := range ps {
			b[p/64] |= 1 << (p % 64)
		}
		return b
	}
	hot := make([]int, 20)
	for k := range hot {
		hot[k] = 10 * k
	}
	scan := func(c *trackChoice, written []uint64, took time.Duration) snapshotFigures {
		f := snapshotFigures{tracked: true, written: written, protected: c.protect(), scanTime: took}
		c.take(f, write, hash)
		return f
	}
	c := trackChoice{chosen: true, on: true, ownedMeasured: true, owned: pieces(hot...)}
	if f := scan(&c, pieces(hot...), 40*time.Microsecond); !f.protected {
		t.Fatal("the first scan left the pages written")
	}
	if f := scan(&c, pieces(hot...), 40*time.Microsecond); !f.protected {
		t.Fatal("the second scan, before the first's cost is known, left the pages written")
	}
	// The scan, 40 µs, and the 20 pieces written after it, 26 µs.
	if want := 66000.0; c.protectNs != want {
		t.Fatalf("protecting costs %v ns, want %v", c.protectNs, want)
	}
	if f := scan(&c, pieces(hot...), 40*time.Microsecond); f.protected || c.rent != 0 {
		t.Fatalf("the third scan protected, or paid rent for pieces first found: %+v", c)
	}
	// From now on the same 20 pieces and another each time: 20 pieces
	// found written again, whose hashing (90 ns each) is the rent.
	left := 0
	for n := 1; ; n++ {
		f := scan(&c, pieces(append(hot, 200+n)...), 40*time.Microsecond)
		if f.protected {
			break
		}
		left++
		if left > 100 {
			t.Fatalf("never protects again: %+v", c)
		}
	}
	// 37 of 1.8 µs reach 66 µs.
	if left != 37 {
		t.Fatalf("%d scans left the pages written before one protected, want 37", left)
	}
	if c.rent != 0 || c.left || ones(c.unprotected) != 0 {
		t.Fatalf("after protecting: %+v", c)
	}
	// A snapshot that does not track starts over.
	scan(&c, pieces(hot...), 40*time.Microsecond)
	scan(&c, pieces(hot...), 40*time.Microsecond)
	c.take(snapshotFigures{ownedKnown: true, written: pieces(hot...), changed: 20, hashed: 20}, write, hash)
	if c.rent != 0 || c.left || ones(c.unprotected) != 0 || c.pendingScan != 0 {
		t.Fatalf("after a snapshot that did not track: %+v", c)
	}
}

// TestTrackChoiceKeepsGoGuest: a Go guest that writes the same 20 of its
// 400 pieces at every call, where a fault costs 15 µs and hashing what it
// owns 60 µs a snapshot, starts tracking and keeps tracking: its scans
// protect about once in a hundred, and only the pieces written since a
// protecting scan count as faults (counting every piece found written, as
// a scan that left them does, would cost 300 µs a snapshot and stop it).
// The scan that armed the tracking measures what protecting costs. And a
// memory that no scan arms stops wanting tracking.
func TestTrackChoiceKeepsGoGuest(t *testing.T) {
	const (
		write = 15 * time.Microsecond
		hash  = 90 * time.Nanosecond
	)
	hot := make([]uint64, 8) // 512 pieces, the first 400 owned
	for p := range 20 {
		hot[(20*p)/64] |= 1 << ((20 * p) % 64)
	}
	owned := make([]uint64, 8)
	for p := range 400 {
		owned[p/64] |= 1 << (p % 64)
	}
	c := trackChoice{chosen: true}
	c.take(snapshotFigures{ownedKnown: true, written: owned, changed: 20, hashed: 400, hashTime: 60 * time.Microsecond}, write, hash)
	if !c.on {
		t.Fatalf("a Go guest does not start tracking: %+v", c)
	}
	// The arming snapshot: its scan protected, and said nothing.
	c.take(snapshotFigures{written: owned, protected: true, scanTime: 10 * time.Microsecond}, write, hash)
	protects := 0
	for n := range 500 {
		f := snapshotFigures{tracked: true, written: hot, protected: c.protect(), scanTime: 10 * time.Microsecond, hashed: 20, hashTime: 3 * time.Microsecond}
		// The first scan after the arming one protects (what that
		// costs is not known until the scan after it counts the
		// faults); the second knows it from the arming scan's faults.
		if n == 1 && f.protected {
			t.Fatalf("the second scan after the arming one protects again: protecting's cost was not measured from the arming scan: %+v", c)
		}
		if f.protected {
			protects++
		}
		c.take(f, write, hash)
		if !c.on {
			t.Fatalf("stopped tracking after %d snapshots (%d protecting): %+v", n+1, protects, c)
		}
	}
	if protects < 2 || protects > 10 {
		t.Fatalf("%d protecting scans in 500, want about 5", protects)
	}

	// Tracking wanted, and no scan arms: it stops within maxUnarmed + 1
	// snapshots, and waits.
	c = trackChoice{chosen: true}
	c.take(snapshotFigures{ownedKnown: true, written: owned, changed: 20, hashed: 400, hashTime: 60 * time.Microsecond}, write, hash)
	for n := 0; c.on; n++ {
		if n > maxUnarmed {
			t.Fatalf("still wanting tracking after %d snapshots no scan armed: %+v", n, c)
		}
		c.take(snapshotFigures{written: owned}, write, hash)
	}
	if c.hold != trackHoldMin {
		t.Fatalf("hold %d after no scan armed, want %d", c.hold, trackHoldMin)
	}
}
