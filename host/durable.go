package host

// Durable sessions: with a state store ([Options.Store]), a client's
// session outlives the replica that served it. The keeping is package
// internal/durable's (claims, fences, records, checkpoints); what is here
// adapts it to the host: its options, its metrics, and the MCP types of
// what the store keeps as JSON. See docs/DESIGN.md, "Durable sessions
// across replicas", and docs/DEPLOY.md.

import (
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/internal/durable"
)

// Checkpoint policies ([Options.Checkpoint]).
const (
	// CheckpointAfterCall saves an instance's state after each call that
	// changed it, before the result is sent: a replica killed at any
	// moment loses no call a client was told succeeded.
	CheckpointAfterCall = durable.CheckpointAfterCall
	// CheckpointOnDrain saves states only when a replica drains (and when
	// a session's instance is idle at drain): cheaper per call, but a
	// replica killed without a drain loses what its clients did since.
	CheckpointOnDrain = durable.CheckpointOnDrain
)

// DefaultStoreTimeout bounds one exchange with the store (see
// [Options.StoreTimeout]).
const DefaultStoreTimeout = durable.DefaultStoreTimeout

// ReasonNotSaved is the stateReset reason of a plugin's state that an
// earlier result marked not saved ([MetaNotSaved]) and that was then lost
// (its instance evicted): the client goes on from a fresh instance, told
// so, rather than from the older stored state.
const ReasonNotSaved = durable.ReasonNotSaved

// ReasonStoreLost is the stateReset reason of a plugin's state that the
// state store lost (it came back empty, or evicted the record) while no
// replica held its instance.
const ReasonStoreLost = durable.ReasonStoreLost

// storeTimeout bounds a store exchange made outside the keeper's own
// bound (adoption of a stateful session).
const storeTimeout = 5 * time.Second

// newDurable returns the keeper of h's sessions in its state store.
func newDurable(h *Host) *durable.Keeper {
	return durable.New(durable.Options{
		Store:          observed{Store: h.opts.Store, m: h.metrics, quota: h.storeQuota()},
		Sessions:       h.ses,
		StoreTimeout:   h.opts.StoreTimeout,
		Replica:        h.opts.Replica,
		Checkpoint:     h.opts.Checkpoint,
		SessionTimeout: h.sessionTimeout(),
		Logger:         h.log,
		Observer:       durableMetrics{h.metrics},
		ExportGrants:   h.grants.export,
		RestoreGrants:  h.grants.restore,
		Reserve: func(id, field string, size int, ttl time.Duration) (func(), error) {
			return h.storeBytes.reserve(id, field, size, ttl, h.tenantOf(""))
		},
		Count: func(id, field string, size int, ttl time.Duration) {
			h.storeBytes.count(id, field, size, ttl, h.tenantOf(""))
		},
		Release:    h.storeBytes.release,
		OpenHandle: h.openAdopted,
		Shares:     h.opts.Tenants,
	})
}

// durableMetrics counts what the keeper reports in the host's metrics.
type durableMetrics struct{ m *metrics }

func (o durableMetrics) Checkpointed(d time.Duration, n int, err error) { o.m.checkpoint(d, n, err) }
func (o durableMetrics) Adopted()                                       { o.m.adopted.Inc() }
func (o durableMetrics) StoreLost()                                     { o.m.storeLost.Inc() }

// replayed returns the first result of the call with at-most-once key k in
// c's session, or nil.
func (h *Host) replayed(c *durable.Claim, k string) *mcp.CallToolResult {
	b := h.dur.Replay(c, k)
	if b == nil {
		return nil
	}
	var res mcp.CallToolResult
	if json.Unmarshal(b, &res) != nil {
		return nil
	}
	if res.Content == nil {
		res.Content = []mcp.Content{}
	}
	return &res
}

// newSession is stateful session ss being made, for its record.
func newSession(ss *mcp.ServerSession, subject string) *durable.NewSession {
	ns := &durable.NewSession{Subject: subject}
	if p := ss.InitializeParams(); p != nil {
		ns.Initialize, _ = json.Marshal(p)
	}
	return ns
}
