package durable

import (
	"errors"
	"fmt"
)

// ErrStateUnavailable is matched by the refusal of a request whose
// session state could not be read or verified in the state store.
var ErrStateUnavailable = errors.New("session state unavailable: the state store did not answer; nothing ran, retry")

// unavailable wraps a store's failure as ErrStateUnavailable.
func unavailable(err error) error {
	if errors.Is(err, ErrStateUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrStateUnavailable, err)
}

// errLostLately refuses, for now, a session the store does not hold while
// it came back empty lately (Keeper.LostLately).
var errLostLately = errors.New("the state store came back empty lately, and the replica that held this session may still hold it")

// ErrServedFromMemory is BeforeCall's answer when the session's claim
// could not be verified (the store did not answer) and the call may run
// on what this replica holds: its result is marked not saved
// ([NotSavedUnavailable]).
var ErrServedFromMemory = errors.New("served from memory")

// MetaMoved-style refusals: the error of a call whose session another
// replica took over while it ran.
var errMoved = errors.New("the session moved to another replica while this call ran, and its effect was not kept: call the tool again")

// errStaleInstance is errMoved of an instance seeded under an older fence
// than its session's claim, which is current: another call of this
// replica's took the session over since the instance started.
var errStaleInstance = fmt.Errorf("%w (the instance is older than the session's claim)", errMoved)

// errLostHere is errStaleInstance of a call whose write met a record the
// store lost, in a replica that could not tell its state was the newest
// (newestHere): its plugins start afresh, said lost. The call is not run
// again on the fresh instance: its client may be gone (a request that sat
// in a stopped process), and a run again answered to no one would take
// the fresh instance's one notice of the reset and write the fresh state
// over the record's mark of the loss, so that the client's next call went
// on from it unsaid (the fault suite's sigstop-redis-empty). It fails;
// the client's next call is told.
var errLostHere = fmt.Errorf("%w; the state store lost the session's state meanwhile, and the plugin starts afresh", errStaleInstance)

// LostHere reports whether err failed a call because the store lost its
// session's state and the call's plugin starts afresh (errLostHere): its
// result tells the client so (stateReset store-lost), as the plugin's
// next call does. Said on both, it reaches the client even when the call
// that takes the fresh instance's notice answers no one.
func LostHere(err error) bool { return errors.Is(err, errLostHere) }

// Unanswered reports whether err, of an exchange with the store, is the
// store not answering (a timeout, a refused connection, the breaker)
// rather than its refusal or its answer that something is not there.
func Unanswered(err error) bool { return unanswered(err) }

// errUnverified fails a call whose state could be neither saved nor
// known current (see checkpoint).
var errUnverified = errors.New("the session's state could not be saved or verified while this call ran (the state store did not answer), and its effect was not kept: call the tool again")

// errChanged: another replica served the session since this one last
// did, and its record could not be read: what this replica holds is
// stale, and the request is refused rather than served from it.
var errChanged = errors.New("the session was served by another replica since")

// errNotKept marks a claim given up: a handle the store does not know.
var errNotKept = errors.New("session not kept")

// errStoreDown is the breaker's refusal: the store failed to answer a
// moment ago.
var errStoreDown = errors.New("state store unavailable (failing fast after a timeout)")

// NotSaved says why a call's effect on its instance is not in the store
// (the reason of a result's notSaved mark), "" when it is.
type NotSaved string

// Reasons of a result's notSaved mark.
const (
	// NotSavedUnavailable: the store did not answer (or was not asked:
	// the breaker is open); the state is saved again in the background.
	NotSavedUnavailable NotSaved = "store-unavailable"
	// NotSavedTooLarge: the state is over the store's limit.
	NotSavedTooLarge NotSaved = "too-large"
	// NotSavedBudget: a byte budget refused the write (the session's,
	// its subject's share or the server's total; the host's count or the
	// store's), the store as it was; the state is saved again in the
	// background, and lands once the budget has room. Apart from
	// NotSavedUnavailable so that a client over its share is not told
	// the store is down.
	NotSavedBudget NotSaved = "over-budget"
	// NotSavedMoved: another replica took the session over while the
	// call ran; the call failed.
	NotSavedMoved NotSaved = "moved"
	// NotSavedUnsnapshot: the plugin's state cannot be snapshotted; a
	// replica taking the session over says its state was lost.
	NotSavedUnsnapshot NotSaved = "cannot-snapshot"
	// NotSavedUnverified: the state could be neither saved nor known
	// current; the call failed.
	NotSavedUnverified NotSaved = "unverified"
)

// notSavedStoreLost notes (Claim.unsaved) a plugin whose state the store
// lost while this replica held no instance of it: writeLost records it
// lost, with ReasonStoreLost. Never a result's mark.
const notSavedStoreLost NotSaved = "store-lost"

// ReasonNotSaved is the stateReset reason of a plugin's state that an
// earlier result marked not saved and that was then lost (its instance
// evicted): the client goes on from a fresh instance, told so, rather
// than from the older stored state.
const ReasonNotSaved = "not-saved"

// ReasonStoreLost is the stateReset reason of a plugin's state that the
// state store lost (it came back empty, or evicted the record) while no
// replica held its instance.
const ReasonStoreLost = "store-lost"

// errRefused wraps a write refused before it was sent (the byte budgets,
// Options.Reserve): the store is as it was.
var errRefused = errors.New("state store: write refused before it was sent")
