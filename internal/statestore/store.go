// Package statestore keeps clients' session records beyond one process,
// so that a session outlives the replica that served it: in Redis for
// replicas behind a proxy, or in a file for one machine.
//
// A record is a set of named fields (the host's own bytes: the session's
// go-sdk state, one field per plugin's saved instance state), written by
// the one replica that owns the session. Ownership is a claim with a
// fencing number: every claim by a new owner increments it, and a write
// carries the number its writer claimed with, so a replica that lost a
// session (it was paused, partitioned, or another replica adopted the
// session) can never overwrite what the new owner wrote: its write fails
// with [ErrFenced].
//
// An owner is alive while its heartbeat is in the store
// ([Store.Heartbeat], renewed well within its TTL). A claim held by an
// owner whose heartbeat is gone (a replica killed, or restarted: a new
// boot) is taken over at once; a claim held by a live owner is taken only
// when the caller asks to steal it (a request for the session reached
// another replica, so the proxy no longer routes it to the holder).
//
// Values are sealed by [Seal] (AES-GCM, a key derived from the state key,
// the record's ID, the field and the record's write version as additional
// data) before they reach a backend, and bounded in size.
package statestore

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"time"
)

// Owner is one replica process: its name (--replica) and its boot, random
// at each start, so that a restarted replica is a new owner.
type Owner struct {
	Replica string `json:"replica"`
	Boot    string `json:"boot"`
}

func (o Owner) String() string { return o.Replica + "/" + o.Boot }

// Errors a caller matches.
var (
	// ErrNotFound: the store has no record of that ID (never written, or
	// expired).
	ErrNotFound = errors.New("statestore: no such session")
	// ErrFenced: the write's fence is not the session's current one:
	// another owner claimed the session since.
	ErrFenced = errors.New("statestore: session claimed by another owner")
	// ErrTooLarge: a value over [MaxValue].
	ErrTooLarge = errors.New("statestore: value too large")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("statestore: closed")
	// ErrStoreLost: the write's fence belongs to another epoch of the
	// store: the store lost its data (it came back empty, was flushed,
	// or failed over to a replica that had not got it) since the fence
	// was claimed. The writer claims again and writes back what it holds.
	ErrStoreLost = errors.New("statestore: the store lost its data since the session was claimed")
	// ErrRecordLost: the session's record is gone (expired or evicted)
	// though the store kept its epoch. The writer claims again and
	// writes back what it holds.
	ErrRecordLost = errors.New("statestore: the session's record is gone")
	// ErrNotReplicated: the store's primary made the write (it may have
	// landed) but fewer of its replicas than asked (a Redis URL's
	// wait_replicas) acknowledged it in time; a failover could lose it.
	// Its outcome is unknown, as a write whose answer was lost: the
	// writer must not count it as made, nor as refused (see
	// docs/DESIGN.md, "Writes wait for replicas").
	ErrNotReplicated = errors.New("statestore: the write was not acknowledged by enough of the store's replicas")
)

// Lost reports whether err says the store no longer has what the writer
// wrote before ([ErrStoreLost] or [ErrRecordLost]).
func Lost(err error) bool { return errors.Is(err, ErrStoreLost) || errors.Is(err, ErrRecordLost) }

// Epoch is the store generation a fence belongs to: a fence's top 32
// bits. A store makes a random one when it has none, so a store that came
// back empty refuses every fence claimed before.
func Epoch(fence uint64) uint32 { return uint32(fence >> 32) }

// Loss is what a store's Epoch says of its loss of an earlier epoch's
// data.
type Loss struct {
	// Recorded: a loss is recorded for the store's epoch now, and the
	// window its recorder gave has not run out.
	Recorded bool
	// Ago is how long before the read the loss was recorded, by the
	// store's own clock (0 unless Recorded): one clock dates the record
	// and reads its age, so that replicas whose clocks disagree read it
	// alike (Redis: the record's window less what is left of its TTL).
	Ago time.Duration
}

// newEpoch is a random epoch, never 0.
func newEpoch() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return max(binary.BigEndian.Uint32(b[:])&0x7fffffff, 1)
}

// firstFence is the number of a session's first claim in a store that
// has none for it (nor a record): random, so that a stale owner's fence of
// a record the store forgot (evicted with its counter) is not the new
// owner's.
func firstFence() uint32 {
	var b [4]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint32(b[:])&0x3fffffff | 1
}

// MaxValue bounds one field's value, sealed: the snapshot cap of a guest's
// state, plus room for the seal.
const MaxValue = 64<<20 + 1024

// HeldError is a claim refused because a live owner holds the session. It
// matches ErrHeld.
type HeldError struct{ Holder Owner }

// ErrHeld matches a [*HeldError].
var ErrHeld = errors.New("statestore: session held by a live owner")

func (e *HeldError) Error() string {
	return fmt.Sprintf("statestore: session held by replica %s", e.Holder.Replica)
}
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Lease is how long after a holder's last verified exchange with the
// store (a claim, a write, a renewal of its fence) a claim of another
// owner is refused, whether its heartbeat is there or not: for that long
// the holder may trust what it holds of the session without asking (a
// store that does not answer, or that lost the record: internal/durable's
// memoryGrace, which is less), and it can do so only if no one can take
// the session from it meanwhile. A holder that releases the session, or
// leaves, lifts it. The store's clock counts it, from its own view of the
// exchange, which comes after the holder's "before I asked".
const Lease = 2500 * time.Millisecond

// SetLease sets the lease s grants a holder, where s grants one (Redis,
// Memory; through a [Seal] too): d is [Lease] in production, 0 (none) in
// tests of anything else, whose owners take sessions from one another at
// once. Call it before s is used.
func SetLease(s Store, d time.Duration) {
	switch s := s.(type) {
	case *Redis:
		s.SetLease(d)
	case *Memory:
		s.SetLease(d)
	case *sealed:
		SetLease(s.Store, d)
	}
}

// LeasedError is a claim refused because another owner's lease on the
// session runs for Wait more. It matches ErrLeased.
type LeasedError struct {
	Holder Owner
	Wait   time.Duration
}

// ErrLeased matches a [*LeasedError].
var ErrLeased = errors.New("statestore: session leased by another owner")

func (e *LeasedError) Error() string {
	return fmt.Sprintf("statestore: session leased by replica %s for %v more", e.Holder.Replica, e.Wait)
}
func (e *LeasedError) Is(target error) bool { return target == ErrLeased }

// Claim is the result of [Store.Claim].
type Claim struct {
	// Fence is the number to write with.
	Fence uint64
	// Previous is the owner the claim was taken from (zero when the
	// session had none, or the caller held it already).
	Previous Owner
	// PreviousAlive says Previous's heartbeat was still there: the claim
	// was stolen from a live owner.
	PreviousAlive bool
	// Taken is the fence of the claim that made the caller the holder:
	// this claim's if it did, else an earlier one's (0 when the store
	// cannot tell). A holder that remembers the fence of the last claim
	// it saw answered knows from Taken whether anyone claimed the
	// session since, itself included (a claim whose reply it lost, or
	// that its client sent again); a fence that moved with Taken
	// unchanged moved by the holder's own bumps.
	Taken uint64
	// Held says the caller held the session already, in the store's
	// current epoch: this claim renewed its hold, and no one claimed the
	// session since the caller's last claim.
	Held bool
}

// Store is a backend. Every method is safe for concurrent use, honours
// ctx, and fails with [ErrClosed] after Close. IDs and field names are
// printable ASCII without spaces, at most 256 bytes.
type Store interface {
	// Heartbeat says owner is alive for ttl. A replica calls it at start
	// and then every ttl/3 or so.
	Heartbeat(ctx context.Context, owner Owner, ttl time.Duration) error
	// Leave removes owner's heartbeat (a replica that drained), so its
	// remaining claims are taken over at once.
	Leave(ctx context.Context, owner Owner) error
	// Claim makes owner the owner of session id, for ttl (renewed by each
	// Put). If owner holds it already, its fence is returned unchanged.
	// If no one holds it, or its holder's heartbeat is gone, or steal is
	// true, owner takes it with the next fence. Else it fails with a
	// *HeldError. The holder's [Lease] refuses a claim that would take
	// it, with a *LeasedError, by stores that processes share (Redis;
	// Memory, whose processes are tests' replicas): a File store's one
	// process holds its every claim. A claim does not need a record to
	// exist.
	Claim(ctx context.Context, id string, owner Owner, ttl time.Duration, steal bool) (Claim, error)
	// Put sets one field of id's record if fence is id's current fence,
	// else fails with ErrFenced (another owner holds it), ErrStoreLost
	// (the fence's epoch is not the store's) or ErrRecordLost (the record
	// expired or was evicted); the record's and the claim's TTL are reset
	// to ttl. Owner, epoch and number are compared in one atomic step.
	Put(ctx context.Context, id, field string, value []byte, fence uint64, ttl time.Duration) error
	// Renew resets the TTL of id's record and claim to ttl if fence is
	// id's current fence, as Put does, without writing a field: a call
	// that runs longer than the TTL keeps its session. With bump, the
	// holder gets a new fence (returned; else fence is): a write of the
	// old fence still in flight (reported failed) can then never land.
	// A bump sent again from the fence it replaced, with no claim since
	// (by anyone, the holder included: its reply was lost, and the client
	// resent it), returns the fence that bump made and changes nothing
	// but the TTL. Refusals are Put's.
	Renew(ctx context.Context, id string, fence uint64, ttl time.Duration, bump bool) (uint64, error)
	// Get returns every field of id's record, or ErrNotFound.
	Get(ctx context.Context, id string) (map[string][]byte, error)
	// Release gives up the claim made with fence, keeping the record (a
	// draining replica): the next claim by anyone succeeds at once. A
	// stale fence is not an error (someone else holds it now).
	Release(ctx context.Context, id string, fence uint64) error
	// Delete removes id's record and claim if fence is current (the
	// client ended its session); a stale fence is ErrFenced.
	Delete(ctx context.Context, id string, fence uint64) error
	// Epoch returns the store's epoch (the [Epoch] of the fences it
	// hands out now), making one if it has none, and whether the store
	// lost an earlier epoch's data within the last window, as recorded by
	// this or another caller, and how long ago ([Loss]). seen is an epoch
	// the caller saw before (0 for none): when the store's is another, the
	// store came back empty (or was flushed) since, and it records that
	// now, for window, unless a loss is recorded for its epoch already. A
	// store that can tell no new client from one whose state it lost uses
	// it (internal/durable: a client header first seen within window of a
	// loss is told its state may be lost; a session the store does not
	// hold, asked for within a minute of the loss, is "not now", at a
	// replica started since too). A File, which cannot lose its data under
	// the one process that holds it, records nothing.
	Epoch(ctx context.Context, seen uint32, window time.Duration) (epoch uint32, lost Loss, err error)
	// Close frees the backend's resources.
	Close() error
}
