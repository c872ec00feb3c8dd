package sandbox

import (
	"math/bits"
	"time"
)

// Which way a snapshot finds what changed is chosen per instance
// (docs/DESIGN.md, "sandbox: snapshots", write tracking). Hashing costs a
// scan of which pieces the instance owns and reading every one of them, at
// every snapshot. Tracking costs a write-protect fault for each piece
// written after a scan that protected it again, and the hashing of the
// pieces written since then; its scans protect only when those faults
// cost less than the hashing they save (a rent-or-buy rule, trackChoice.
// protect). A guest that writes much the same pieces at every call (a Go
// guest writes 15 to 20 of the few hundred to thousands it owns) then
// takes its faults once in a long while, and each snapshot hashes about
// what the call wrote: tracking costs it about twice hashing the pieces
// written, whatever a fault costs. A guest that writes different pieces
// at every call pays a fault for each: more, where faults are dear (14 µs
// in the VMs seen here, against 0.2 µs to hash a piece).
//
// So an instance starts tracking where that estimate, from its hashed
// snapshots, is well below hashing, and stops once what its tracked
// snapshots really cost (their scans, their hashing, and the faults
// counted at the scans) has exceeded hashing by trackBudget snapshots'
// worth, so that the bursts of faults after a protecting scan are
// weighed over the snapshots they serve.

// Tracking starts when its estimate is at most trackStartShare of hashing
// (1.5 times cheaper), so that an instance near the line does not switch
// at every snapshot: a switch costs a snapshot that finds what changed the
// old way (the first scan of a tracking arms it and says nothing). After
// it stops, the instance waits trackHoldMin snapshots before it may track
// again, twice as long each time it stops, up to trackHoldMax. trackBudget
// is how far, in snapshots' worth of hashing, tracking may fall behind
// hashing before it stops (and how far ahead its credit may run).
const (
	trackStartShare = 2.0 / 3
	trackHoldMin    = 16
	trackHoldMax    = 1024
	trackBudget     = 32
	// maxUnarmed is how many snapshots in a row may want tracking and
	// find their scan unarmed (an arming scan says nothing) before the
	// instance hashes instead.
	maxUnarmed = 2
)

// trackChoice is an instance's choice between tracking its memory's writes
// and hashing the pieces it owns; its zero value follows the process's
// default (trackingCost's measurement alone) until the instance has hashed
// once, which tells the pieces it owns.
type trackChoice struct {
	chosen bool // on was chosen by the instance's own figures
	on     bool
	// writtenChanged is the pieces whose hash changed per hashed
	// snapshot, a running mean: the fewest it can have written (a piece
	// written back to the image, or with the bytes it held, is not
	// counted).
	writtenChanged float64
	// behind is how much more, in ns, its tracked snapshots have cost
	// since tracking started than hashing would have (negative: less);
	// tracking stops once it passes trackBudget snapshots' worth of
	// hashing, and its credit is capped at as much. unarmed counts the
	// snapshots in a row that tracking was wanted and no scan tracked.
	behind  float64
	unarmed int
	// owned is a bitmap of the pieces the instance has written since its
	// memory was mapped, which a snapshot that hashes reads: pagemap's
	// answer when it last hashed, the pieces tracked since ORed in;
	// measured once it hashed with its memory unregistered.
	owned         []uint64
	ownedMeasured bool
	// hashNs is the least a snapshot that hashed all it owns took per
	// piece (the least: the sorting around the hashing, a collection or
	// a preemption only ever add to it), 0 until one hashed minHashed.
	// Not after the memory grew: reading pages never touched takes a
	// fault each.
	hashNs float64
	// ownScanNs is what finding the pieces it owns took (pagemap), a
	// running mean: hashing pays it at every snapshot, and where reading
	// the page tables misses the cache it costs as much as the hashing.
	ownScanNs float64
	hold      int // snapshots left before it may track again
	// backoff is the hold set the next time tracking stops paying.
	backoff int

	// While it tracks, a scan need not protect again the pages it
	// finds written (protect): a scan that leaves them as they are
	// names the pages written since the last scan that protected,
	// which came no later than the last snapshot, and the snapshot
	// hashes those to find what changed. Protecting costs the scan a
	// TLB shootdown per 2 MiB written (an interrupt to every other
	// core that ran the process) and the next call a fault per page it
	// writes again, while a Go guest writes much the same 20 pieces
	// at every call; leaving them costs hashing them at every
	// snapshot. So a scan protects when the hashing spent since the
	// last one that did, on pieces an earlier scan had found written
	// already, reaches what protecting costs (a rent-or-buy rule,
	// within twice the best choice made knowing the future).
	//
	// unprotected is the last scan's answer when it left the pages
	// written unprotected (empty after one that protected), left
	// whether it did; rent the
	// hashing spent since the last protecting scan, in ns; protectNs
	// what a protecting scan costs (a running mean of the scan's time
	// and the faults of the pages found written by the next scan), 0
	// until measured; pendingScan a protecting scan's time, until the
	// next scan counts its faults.
	unprotected []uint64
	left        bool
	rent        float64
	protectNs   float64
	pendingScan time.Duration
}

// protect reports whether the instance's next scan is to protect again
// the pages it finds written.
func (c *trackChoice) protect() bool {
	return c.protectNs == 0 || c.rent >= c.protectNs
}

// want reports whether the instance's writes are to be tracked.
func (c *trackChoice) want() bool {
	if !c.chosen {
		return trackingPaysByDefault()
	}
	return c.on
}

// snapshotFigures are what one snapshot saw, for the next choice.
type snapshotFigures struct {
	// tracked: the kernel said which pieces were written since the
	// last snapshot, and written is their bitmap (those written since
	// the last scan that protected, protected: whether this one did,
	// scanTime what it took); ownedKnown: it did
	// not, and written is pagemap's bitmap of the pieces the instance
	// owns, read while its memory was not registered for tracking (a
	// registered memory's never-written pages read as swapped); neither:
	// written is unused.
	tracked, ownedKnown bool
	written             []uint64
	protected           bool
	scanTime            time.Duration
	changed             int           // pieces whose hash changed
	grew                bool          // the memory grew since the last snapshot
	hashed              int           // pieces hashed
	hashTime            time.Duration // what finding what changed took (hashing, mostly)
	ownScanTime         time.Duration // what reading which pieces it owns took, if it did
}

// minHashed is the fewest pieces a snapshot hashes for its time to count
// as what hashing a piece costs (the sorting around it, 5 to 10 µs for a
// Go guest, costs much the same whatever their number).
const minHashed = 128

// update takes one snapshot's figures and chooses for the next.
func (c *trackChoice) update(f snapshotFigures) {
	if write, hash, ok := trackingCosts(); ok {
		c.take(f, write, hash)
	}
}

// take is update where a piece written costs write tracked, and hash
// hashed in the cache (trackingCost).
func (c *trackChoice) take(f snapshotFigures, write, hash time.Duration) {
	if !f.tracked {
		c.unprotected, c.left, c.rent, c.pendingScan = c.unprotected[:0], false, 0, 0
	}
	tracked := -1.0 // what this snapshot cost tracked, in ns
	switch {
	case f.tracked:
		c.owned = orInto(c.owned, f.written)
		faulted := c.scanned(f, write, hash)
		tracked = float64((f.scanTime + f.hashTime).Nanoseconds()) + float64(faulted)*float64(write.Nanoseconds())
	case f.ownedKnown:
		c.owned = append(c.owned[:0], f.written...)
		c.ownedMeasured = true
		c.writtenChanged = average(c.writtenChanged, float64(f.changed))
		if ns := float64(f.hashTime.Nanoseconds()) / float64(f.hashed); f.hashed >= minHashed && !f.grew && (c.hashNs == 0 || ns < c.hashNs) {
			c.hashNs = ns
		}
		if f.ownScanTime > 0 {
			c.ownScanNs = average(c.ownScanNs, float64(f.ownScanTime.Nanoseconds()))
		}
	default:
		c.writtenChanged = average(c.writtenChanged, float64(f.changed))
	}
	if !c.ownedMeasured {
		// What hashing would cost is not known (an instance that
		// tracks from its start never hashes): the default stands.
		return
	}
	hashNs := c.hashNs
	if hashNs == 0 {
		// Too few pieces to time: the process's measurement, of pieces
		// in the cache, so less than a snapshot's.
		hashNs = float64(hash.Nanoseconds())
	}
	hashed := float64(ones(c.owned))*hashNs + c.ownScanNs
	budget := trackBudget * hashed
	switch {
	case c.want():
		// Its first tracked snapshot is still to come after it
		// started (the first scan arms): nothing to weigh yet. The
		// arming scan protected every page, and the next scan's
		// faults measure what protecting costs (else the two scans
		// after it protect as well, each charged a fault per piece).
		// A memory that a scan never arms (an ioctl failing) would
		// pay for a protecting scan and the hashing at every
		// snapshot: it stops, as tracking that did not pay.
		if tracked < 0 {
			if f.protected {
				c.pendingScan = max(f.scanTime, 1)
			}
			if c.unarmed++; c.unarmed > maxUnarmed {
				c.unarmed = 0
				c.backoff = min(max(2*c.backoff, trackHoldMin), trackHoldMax)
				c.chosen, c.on, c.hold = true, false, c.backoff
				return
			}
			c.chosen, c.on = true, true
			return
		}
		c.unarmed = 0
		c.behind = max(c.behind+tracked-hashed, -budget)
		if c.behind > budget {
			c.backoff = min(max(2*c.backoff, trackHoldMin), trackHoldMax)
			c.chosen, c.on, c.hold = true, false, c.backoff
		} else {
			c.chosen, c.on = true, true
		}
	case c.hold > 0:
		c.hold--
	default:
		// Tracking a guest that writes the same pieces at every call
		// costs about twice hashing them (its faults come once in
		// f/h snapshots, and the rent-or-buy rule pays as much again
		// in hashing), or a fault each where faults are cheaper than
		// that. The changed pieces miss some written (a piece written
		// back to the image, or with the bytes it held), and the
		// estimate misses pieces written at one call only, so a guest
		// that writes many pieces and changes few starts again, and
		// stops again once its tracked snapshots have cost more: a
		// trial, which the doubling hold makes rarer each time.
		estimate := c.writtenChanged * min(float64(write.Nanoseconds()), 2*hashNs)
		c.chosen, c.on = true, estimate <= trackStartShare*hashed
		if c.on {
			c.behind, c.unarmed = 0, 0
		}
	}
}

// scanned takes a tracked snapshot's scan into the choice of protecting
// (protect), and returns the pieces written since the scan before, which
// took a fault each: those of f.written that scan left protected.
func (c *trackChoice) scanned(f snapshotFigures, write, hash time.Duration) int {
	faulted, again := 0, 0
	for k, w := range f.written {
		var left uint64
		if k < len(c.unprotected) {
			left = c.unprotected[k]
		}
		faulted += bits.OnesCount64(w &^ left)
		again += bits.OnesCount64(w & left)
	}
	if c.pendingScan > 0 {
		// The pages the last scan protected that were written since
		// faulted: what protecting cost, with the scan.
		c.protectNs = average(c.protectNs, float64(c.pendingScan.Nanoseconds())+float64(faulted)*float64(write.Nanoseconds()))
		c.pendingScan = 0
	}
	if f.protected {
		c.unprotected, c.left, c.rent = c.unprotected[:0], false, 0
		c.pendingScan = max(f.scanTime, 1)
		return faulted
	}
	hashNs := c.hashNs
	if hashNs == 0 {
		hashNs = float64(hash.Nanoseconds())
	}
	c.rent += float64(again) * hashNs
	c.unprotected, c.left = append(c.unprotected[:0], f.written...), true
	return faulted
}

// average is an exponentially weighted mean, a quarter to the newest.
func average(mean, x float64) float64 {
	if mean == 0 {
		return x
	}
	return (3*mean + x) / 4
}

// ones counts the bits set in b.
func ones(b []uint64) int {
	n := 0
	for _, w := range b {
		n += bits.OnesCount64(w)
	}
	return n
}

// orInto sets in dst every bit set in b, growing dst to b's length.
func orInto(dst, b []uint64) []uint64 {
	for len(dst) < len(b) {
		dst = append(dst, 0)
	}
	for k, w := range b {
		dst[k] |= w
	}
	return dst
}
