// Package durable keeps MCP sessions in a state store
// (internal/statestore), so that a session outlives the replica that
// served it. It owns one thing: which sessions this replica holds, under
// which fence, and what it wrote of them. It knows nothing of MCP: what
// it keeps of the protocol (a client's initialize parameters, a call's
// result) it keeps as JSON the host gives it.
//
// # The invariant
//
// Whoever holds an instance holds the fence that vouches for it. A
// replica claims a session before a request runs on it; the claim's fence
// (the store's epoch and a claim number) goes to the session layer with
// the states it seeds the session's instances from (sessions.Manager.Seed),
// each instance keeps the fence it started under, and a lease carries it
// (sessions.Lease.Fence). Every write of an instance's state names that
// fence, and is made only if it is the one the session's instances were
// last seeded under, and compared by the store where the record lives: a
// replica that lost the session, or an instance that started before the
// session changed hands, can never write over the newer state.
//
// # One request, top to bottom
//
//  1. [Keeper.BeforeCall] (or [Keeper.Ensure], for a session being made)
//     claims the session. The first time this replica serves it, or when
//     the fence moved (another replica served it since), the record is read
//     after the claim, so a write the previous holder acknowledged is in
//     it, and the session layer's client is seeded from it under the new
//     fence: instances of the old one are retired. Only then is the new
//     fence adopted. A claim is taken even from a live holder: the request
//     reached this replica, so the proxy routes the session here now.
//     A call that can have no effect outside its instance
//     (plugins.Plugin.Contained) skips this exchange when the replica
//     holds a claim nothing says is out of date ([Keeper.CheckLater]):
//     step 3 checks the claim instead.
//  2. The host leases the instance and runs the call; [Keeper.KeepAlive]
//     renews the record meanwhile, every third of its TTL.
//  3. [Keeper.AfterCall] checkpoints the instance before the result is
//     sent (policy [CheckpointAfterCall]), with the call's first result
//     under its at-most-once key ([Once]) in the same write. It returns why
//     the state is not saved ([NotSaved], "" when it is) and an error when
//     the call must fail: the session moved ([NotSavedMoved]), or its state
//     could be neither saved nor known current ([NotSavedUnverified]). A
//     resend of the call finds its result with [Keeper.Replay]. For a
//     call run before its claim was checked, [Keeper.AfterUncheckedCall]:
//     the write is made only under the claim's fence, even of a state
//     unchanged, and so checks it (or the claim is checked then:
//     [Keeper.CheckSince]); a call whose instance was stale, and of which
//     nothing can be in the store, gets [ErrRunAgain], and is run again
//     after step 1; one whose claim could not be checked to a conclusion
//     gets [ErrOutcomeUnknown], keeps its instance, and the session's next
//     request is claimed first.
//  4. [Keeper.Ended] deletes the record of a session its client ended (or
//     that timed out); [Keeper.Drain] checkpoints every instance and
//     releases the claims of the sessions it saved whole.
//
// # Guarantees
//
//   - A write lands or is known not to. A write that got no answer may
//     still land (a Redis script runs on after its caller gave up): the
//     claim is marked dirty, and its fence bumped before its next write,
//     so the lost write can never land after it.
//   - The store can forget. A store that came back empty, was flushed or
//     evicted a record refuses the old fence (statestore.ErrStoreLost): the
//     holder writes back what it holds under a new claim, and a plugin
//     whose instance it no longer holds starts afresh with the reason
//     [ReasonStoreLost]; nothing is reset silently. A replica that sees
//     the store's epoch change records the loss in the store, for the
//     session timeout: a client header the store has no record of, first
//     seen while it lasts, may be one whose state went with the store
//     while its replica was killed too, and is told so.
//   - Nothing stale is served. When the store does not answer, a session
//     is served from memory only if this replica verified its claim within
//     the last 2 s and nothing since says it is stale; its results are
//     marked [NotSavedUnavailable] ([ErrServedFromMemory]). Any other
//     request is refused with an error matching [ErrStateUnavailable]:
//     nothing ran, retry. An instance whose last checkpoint failed and was
//     then evicted comes back afresh with the reason [ReasonNotSaved], never
//     as the older stored state ([Keeper.Saved]); one whose saved state
//     cannot be read now is refused, retryable, never started afresh.
//   - At most once. The results of a plugin's last calls that carried an
//     at-most-once key are kept in its field: at most 8, 32 KiB in all, of
//     them at most 2 proxy resends (keys "r:…"); a result over 32 KiB is
//     kept as a refusal to run the call again. The keys of the 512 calls
//     before those are kept as 8-byte digests: such a call, arriving late
//     (it waited in a stopped replica while its client's retry ran
//     elsewhere), is refused rather than run again.
//
// # Defaults and limits
//
// Every exchange with the store is bounded by [Options.StoreTimeout]
// ([DefaultStoreTimeout], 1 s), whatever the caller's context allows, and
// a claim with its reads and writes by four times that. After an exchange
// that got no answer, a breaker skips the store for 2 s, so a stalled
// store costs one call a timeout, not every call. An exchange this
// process stalled itself (its deadline fired more than a quarter of the
// bound late, or it began with under three quarters of the bound left:
// the process was stopped, or slow earlier in the call) does not open
// the breaker, so a replica continued after
// SIGSTOP asks the store before it serves anything from memory. A replica's heartbeat
// ([Keeper.Heartbeat]) says it is alive every 2 s, for 6 s; it checks the
// replica's state key against the store (statestore.CheckKey) until that
// passes: a mismatch makes the replica not ready for good
// ([Keeper.KeyMismatch]). It also forgets the claims of clients the
// session layer ended, renews live sessions' records every third of their
// TTL and saves again what failed to save. A record lives unused for the
// session timeout ([Options.SessionTimeout]), a day when sessions never
// time out.
//
// # Records
//
// A session's record is under its store ID ([StoreID]): "s.<Mcp-Session-Id>",
// "h.<handle id>" or "c.<hex of the first 16 bytes of the SHA-256 of the
// client header>". Its fields: "mcp", a [SessionRecord] (what a replica
// needs to take a stateful HTTP session over); "p/NAME" per plugin the
// client used, the instance's saved state or why it could not be saved,
// and the results kept for at-most-once calls; "b/NAME" beside it for a
// host snapshot of 16 KiB or more, the frames of a state once written
// whole, to which "p/NAME" refers for the frames a call did not change
// (frames.go: a checkpoint writes what changed, and the base only right
// after the state was written whole); "grants", the session's
// run-time grant answers, as the host exports them. Sessions that cannot
// outlive their process (stdio, in-memory: IDs starting with
// [LocalPrefix]) have no record.
//
// # Concurrency and lifetime
//
// A [Keeper]'s methods are safe for concurrent use, and a nil *Keeper
// (no store) keeps nothing. A session's writes take turns under its
// [Claim]. The caller runs [Keeper.Heartbeat] until the replica stops,
// then calls [Keeper.Wait] for the keeper's background work (renewals,
// write-backs).
package durable
