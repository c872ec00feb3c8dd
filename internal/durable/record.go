package durable

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// LocalPrefix starts the ID of a transport session that has none of its
// own (stdio, in-memory): such a session cannot outlive its process, and
// is not kept.
const LocalPrefix = "local-"

// StoreID is key's ID in the store, "" for a key that cannot outlive its
// process (stdio and in-memory sessions, sessionless requests without a
// handle).
func StoreID(key sessions.Key) string {
	switch key.Kind() {
	case sessions.KindConn:
		if id := key.ID(); id != "" && !strings.HasPrefix(id, LocalPrefix) {
			return "s." + id
		}
	case sessions.KindHandle:
		return "h." + key.ID()
	case sessions.KindClient:
		sum := sha256.Sum256([]byte(key.ID()))
		return "c." + hex.EncodeToString(sum[:16])
	}
	return ""
}

// SessionRecord is the "mcp" field: what a replica needs to take over a
// stateful HTTP session.
type SessionRecord struct {
	// Initialize is the client's initialize parameters (MCP's
	// InitializeParams, as JSON).
	Initialize json.RawMessage `json:"initialize,omitempty"`
	// Subject is the keyed digest of the authenticated user the session
	// is bound to ("-" for none, as in handles): only that user's
	// requests take it over.
	Subject string `json:"subject,omitempty"`
}

// ReadSession reads stateful session id's record ("mcp" field), to take
// the session over. It fails with statestore.ErrNotFound when the store
// does not know the session.
func (d *Keeper) ReadSession(ctx context.Context, id string) (SessionRecord, error) {
	var sr SessionRecord
	rec, err := d.store.Get(ctx, "s."+id)
	if err != nil {
		return sr, err
	}
	if b, ok := rec["mcp"]; ok {
		if err := json.Unmarshal(b, &sr); err != nil {
			return sr, fmt.Errorf("session record: %w", err)
		}
	}
	return sr, nil
}

// NewSession is a stateful session being made, whose record Ensure
// writes.
type NewSession struct {
	// Initialize is its client's initialize parameters (as JSON), nil if
	// it has none yet.
	Initialize json.RawMessage
	Subject    string // the keyed digest of its authenticated user
}

// pluginRecord is a "p/NAME" field.
type pluginRecord struct {
	// Host, SHA256 and Data are a plugins.State.
	Host   bool   `json:"host,omitempty"`
	SHA256 string `json:"sha256"`
	Data   []byte `json:"data,omitempty"`
	// Lost says why the state could not be saved (the plugin cannot be
	// snapshotted, or its last state was not saved and its instance is
	// gone: writeLost): a replica that takes the session over tells the
	// client its state was reset, for Reason (sessions.ReasonReplicaLost
	// when empty, as older replicas wrote it).
	Lost   string `json:"lost,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Unsaid is the reason of a reset the client may not have been told
	// of: the state is what the plugin started afresh with since, saved
	// by a call that may have answered no one (its request lived through
	// a stop of the process: sessions.Lease.KeepNotice). Whoever starts
	// from the state says the reset; the next call saved clears it.
	Unsaid string `json:"unsaid,omitempty"`
	// Done are the results of the plugin's last calls that carried an
	// at-most-once key, oldest first (at most maxOnce, maxOnceBytes).
	Done []Once `json:"done,omitempty"`
	// Ran are the digests (ranSize bytes each, oldest first, at most
	// maxRan) of the at-most-once keys of the plugin's calls that
	// completed before those in Done: such a call is not run again,
	// though its result is no longer kept. A request can arrive long
	// after its client's retry ran and many calls followed (it waited in
	// a replica stopped by SIGSTOP, and ran when the replica was
	// continued): with Done alone it ran twice (issue #25,
	// sigstop-replica).
	Ran []byte `json:"ran,omitempty"`
	// split is a version 2 record's state, its frames apart (Data nil
	// until joined with the base's: readPlugin).
	split *splitState
}

// Once is a call's first result, under its at-most-once key.
type Once struct {
	Key    string          `json:"key"`
	Result json.RawMessage `json:"result"`
}

// Bounds of the results kept per plugin for at-most-once calls.
const (
	maxOnce      = 8
	maxOnceBytes = 32 << 10
	maxResends   = 2
	// maxRan keys of calls whose results are no longer kept are
	// remembered, ranSize bytes of digest each (4 KiB per plugin).
	maxRan  = 512
	ranSize = 8
)

// ranDigest is the digest of at-most-once key k kept in pluginRecord.Ran.
func ranDigest(k string) []byte {
	sum := sha256.Sum256([]byte(k))
	return sum[:ranSize]
}

// remember adds first to the results kept for plugin, within the bounds
// (a result over maxOnceBytes is kept as a refusal to run again). c.mu is
// held.
func (c *Claim) remember(plugin string, first *Once) {
	if first == nil {
		return
	}
	c.done[plugin], c.ran[plugin] = c.withOnce(plugin, first)
}

// withOnce returns what remember would keep for plugin, changing nothing:
// a checkpoint writes it with the call's state, and keeps it only once
// the call is acknowledged (a call failed as not kept must not be
// answered from its first run when it is retried). c.mu is held.
func (c *Claim) withOnce(plugin string, first *Once) (done []Once, ran []byte) {
	if first == nil {
		return c.done[plugin], c.ran[plugin]
	}
	if len(first.Result) > maxOnceBytes {
		first = &Once{Key: first.Key, Result: tooLarge}
	}
	// Clipped: the claim's own lists are not written through.
	list := append(slices.Clip(c.done[plugin]), *first)
	// Newest first: within the bounds, and at most maxResends results of
	// resends (a proxy resends only the calls in flight when a replica
	// died: the last ones), so that keyless calls cost little.
	kept := make([]Once, 0, len(list))
	size, resends := 0, 0
	for i := len(list) - 1; i >= 0 && len(kept) < maxOnce; i-- {
		o := list[i]
		if strings.HasPrefix(o.Key, "r:") {
			if resends == maxResends {
				continue
			}
			resends++
		}
		if size += len(o.Result); size > maxOnceBytes {
			break
		}
		kept = append(kept, o)
	}
	slices.Reverse(kept)
	// The keys of the results dropped are remembered without them.
	ran = slices.Clip(c.ran[plugin])
	for _, o := range list {
		if !slices.ContainsFunc(kept, func(k Once) bool { return k.Key == o.Key }) {
			ran = append(ran, ranDigest(o.Key)...)
		}
	}
	if over := len(ran) - maxRan*ranSize; over > 0 {
		ran = ran[over:]
	}
	return kept, ran
}

// tooLarge is the result kept in place of one over maxOnceBytes: an MCP
// CallToolResult (isError) saying the call is not run again.
var tooLarge = json.RawMessage(`{"content":[{"type":"text","text":"this call completed before, and its result was too large to keep: it was not run again"}],"isError":true}`)

// ServedFromMemory ends a call of plugin served from memory with c (see
// [Keeper.BeforeCall]) as a checkpoint that could not write would: its
// result first is kept, so a retry with its key is answered from it, and
// the plugin is marked unsaved, so its state is written again once the
// store answers (with that result), and an eviction before then says the
// state was reset rather than restoring the store's older one. A c that
// was retired meanwhile (the session claimed anew, its notes taken over)
// hands the call to key's claim now.
func (d *Keeper) ServedFromMemory(key sessions.Key, c *Claim, plugin string, first *Once) {
	if d == nil || c == nil {
		return
	}
	c.mu.Lock()
	if c.retired {
		c.mu.Unlock()
		d.mu.Lock()
		c = d.claims[key]
		d.mu.Unlock()
		if c == nil {
			return
		}
		c.mu.Lock()
	}
	defer c.mu.Unlock()
	c.remember(plugin, first)
	if d.policy == CheckpointAfterCall {
		c.unsaved[plugin] = NotSavedUnavailable
	}
}

// Replay returns the first result (an MCP CallToolResult, as JSON) of
// the call with at-most-once key k in c's session, or nil.
func (d *Keeper) Replay(c *Claim, k string) json.RawMessage {
	if d == nil || c == nil || k == "" {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, list := range c.done {
		for _, o := range list {
			if o.Key == k {
				return o.Result
			}
		}
	}
	sum := ranDigest(k)
	for _, ran := range c.ran {
		for i := 0; i+ranSize <= len(ran); i += ranSize {
			if string(ran[i:i+ranSize]) == string(sum) {
				return ranBefore
			}
		}
	}
	return nil
}

// ranBefore is the result of a call whose key is in pluginRecord.Ran: an
// MCP CallToolResult (isError) saying it is not run again.
var ranBefore = json.RawMessage(`{"content":[{"type":"text","text":"this call completed before, and its result is no longer kept: it was not run again"}],"isError":true}`)
