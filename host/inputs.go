package host

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
)

// Several questions at once (request_inputs): a guest asks elicitations,
// sampling requests and the client's roots together. A 2026-07-28 client
// gets them in one input-required result and answers them in one retry;
// an older client is asked them one after another, in key order, while
// the call runs.

// maxBatch bounds the input requests of one request_inputs call.
const maxBatch = 8

// requestInputs serves the guest's request_inputs.
func (e *callEnv) requestInputs(ctx context.Context, input []byte) abi.InputResults {
	q, err := batchQuestion(input)
	if err != nil {
		return abi.InputResults{Error: err.Error()}
	}
	for _, r := range q.batch {
		if p, ok := r.(*mcp.ElicitParams); ok {
			e.issueURLs(p)
		}
	}
	if e.questions != nil {
		if a, ok := ask(ctx, e, q, q.batched); ok {
			return a
		}
		return abi.InputResults{Error: "the call was cancelled"}
	}
	// Not a guest on its own goroutine: only from a prompt, resource or
	// completion request, which cannot be parked; ask a client with a
	// session directly.
	_, req := e.current()
	ss := req.Session
	if protocolOf(req) >= sessionlessProtocol {
		return abi.InputResults{Error: "questions are available to " + sessionlessProtocol + " clients only during a tool call"}
	}
	var caps *mcp.ClientCapabilities
	if ip := ss.InitializeParams(); ip != nil {
		caps = ip.Capabilities
	}
	q.dropUnsupported(caps)
	e.waitForPerson(ctx, func() {
		// Withdrawn at a drain, as a single question is.
		actx, done := e.h.asks.add(ctx)
		defer done()
		q.askBatchLegacy(actx, ss)
	})
	select {
	case a := <-q.batched:
		return a
	default:
		return abi.InputResults{Error: "the call was cancelled"}
	}
}

// batchQuestion checks a guest's batch: 1 to maxBatch requests under keys
// of at most 64 letters, digits, "_" or "-", each a valid elicitation
// (the form rules of create_elicitation), sampling request (with
// messages) or roots request.
func batchQuestion(input []byte) (*question, error) {
	shape := func(err error) error {
		return fmt.Errorf(`input must be {"inputRequests": {"KEY": {"method": "elicitation/create"|"sampling/createMessage"|"roots/list", "params": {...}}}}: %v`, err)
	}
	// params may be left out (roots/list has none); the SDK's decoder
	// wants an object.
	var raw struct {
		InputRequests map[string]struct {
			Method string          `json:"method"`
			Params json.RawMessage `json:"params"`
		} `json:"inputRequests"`
	}
	if err := strictJSON(input, &raw); err != nil {
		return nil, shape(err)
	}
	for k, r := range raw.InputRequests {
		if len(r.Params) == 0 || string(r.Params) == "null" {
			r.Params = json.RawMessage(`{}`)
			raw.InputRequests[k] = r
		}
	}
	b, _ := json.Marshal(raw.InputRequests)
	var in struct{ InputRequests mcp.InputRequestMap }
	if err := json.Unmarshal(b, &in.InputRequests); err != nil {
		return nil, shape(err)
	}
	switch n := len(in.InputRequests); {
	case n == 0:
		return nil, errors.New("no input requests")
	case n > maxBatch:
		return nil, fmt.Errorf("%d input requests, over the limit of %d", n, maxBatch)
	}
	q := &question{batch: mcp.InputRequestMap{}, schemas: map[string][]byte{}, errs: map[string]string{}, responses: map[string]any{}, batched: make(chan abi.InputResults, 1)}
	keys := slices.Sorted(maps.Keys(in.InputRequests))
	for _, k := range keys {
		if !validKey(k) || strings.Contains(k, ",") {
			return nil, fmt.Errorf("input request key %q: want 1 to 64 letters, digits, '_' or '-'", k)
		}
		if hostKey(k) {
			return nil, fmt.Errorf("input request key %q: keys beginning with \"wasmtools.\" are the host's", k)
		}
		switch r := in.InputRequests[k].(type) {
		case *mcp.ElicitParams:
			b, _ := json.Marshal(r)
			var er abi.ElicitRequest
			if err := json.Unmarshal(b, &er); err != nil {
				return nil, fmt.Errorf("input request %q: %v", k, err)
			}
			params, schema, err := elicitParams(er)
			if err != nil {
				return nil, fmt.Errorf("input request %q: %v", k, err)
			}
			q.batch[k], q.schemas[k] = params, schema
		case *mcp.CreateMessageWithToolsParams:
			if len(r.Messages) == 0 {
				return nil, fmt.Errorf("input request %q: a sampling request needs messages", k)
			}
			q.batch[k] = r
		case *mcp.ListRootsParams:
			q.batch[k] = r
		default:
			return nil, fmt.Errorf("input request %q: unsupported method", k)
		}
	}
	q.key = strings.Join(keys, ",")
	return q, nil
}

// dropUnsupported answers, with an error, the requests of a batch the
// client offers no capability for, and leaves the rest to ask.
func (q *question) dropUnsupported(caps *mcp.ClientCapabilities) {
	for k, r := range q.batch {
		var why string
		switch r := r.(type) {
		case *mcp.ElicitParams:
			switch {
			case caps == nil || caps.Elicitation == nil:
				why = "the client does not offer elicitation"
			case r.Mode == "url" && caps.Elicitation.URL == nil:
				why = `the client does not offer "url" elicitation`
			}
		case *mcp.CreateMessageWithToolsParams:
			if caps == nil || caps.Sampling == nil {
				why = "the client does not offer sampling"
			}
		case *mcp.ListRootsParams:
			if caps == nil || caps.RootsV2 == nil {
				why = "the client does not offer roots"
			}
		}
		if why != "" {
			q.errs[k] = why
			delete(q.batch, k)
		}
	}
}

// askBatchLegacy asks a client before 2026-07-28 each request of the
// batch in turn, with the server requests of the session.
func (q *question) askBatchLegacy(ctx context.Context, ss *mcp.ServerSession) {
	for _, k := range slices.Sorted(maps.Keys(q.batch)) {
		var resp any
		var err error
		switch r := q.batch[k].(type) {
		case *mcp.ElicitParams:
			var res *mcp.ElicitResult
			if res, err = ss.Elicit(ctx, r); err == nil {
				resp = answerOf(res, &question{params: r, schema: q.schemas[k]})
			}
		case *mcp.CreateMessageWithToolsParams:
			resp, err = ss.CreateMessageWithTools(ctx, r)
		case *mcp.ListRootsParams:
			var res *mcp.ListRootsResult
			if res, err = ss.ListRoots(ctx, r); err == nil {
				resp = rootsOf(res)
			}
		}
		if err != nil {
			q.errs[k] = withdrawn(ctx, err)
			continue
		}
		q.responses[k] = resp
	}
	q.batched <- q.answers()
}

// replyBatch answers the batch with a 2026-07-28 client's responses,
// checking each against what was asked.
func (q *question) replyBatch(responses mcp.InputResponseMap) {
	for k, r := range q.batch {
		resp, ok := responses[k]
		if !ok {
			q.errs[k] = "the client's retry carried no answer"
			continue
		}
		switch r := r.(type) {
		case *mcp.ElicitParams:
			q.responses[k] = answerOf(resp, &question{params: r, schema: q.schemas[k]})
		case *mcp.CreateMessageWithToolsParams:
			switch resp.(type) {
			case *mcp.CreateMessageResult, *mcp.CreateMessageWithToolsResult:
				q.responses[k] = resp
			default:
				q.errs[k] = "the answer is not a sampling result"
			}
		case *mcp.ListRootsParams:
			if lr, ok := resp.(*mcp.ListRootsResult); ok && lr != nil {
				q.responses[k] = rootsOf(lr)
			} else {
				q.errs[k] = "the answer is not a roots list"
			}
		}
	}
	q.batched <- q.answers()
}

// answers is what the guest gets back.
func (q *question) answers() abi.InputResults {
	out := abi.InputResults{InputResponses: map[string]json.RawMessage{}}
	for k, v := range q.responses {
		b, err := json.Marshal(v)
		if err != nil {
			q.errs[k] = err.Error()
			continue
		}
		out.InputResponses[k] = b
	}
	if len(q.errs) > 0 {
		out.Errors = maps.Clone(q.errs)
	}
	return out
}
