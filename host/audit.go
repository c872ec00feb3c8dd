package host

import (
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/wasmtools/wasmtools/abi"
)

// auditEntry is one line of the record log: one tool call.
type auditEntry struct {
	Time    time.Time `json:"time"`
	Session string    `json:"session"`
	// Subject is the authenticated subject the call ran for; left out
	// for none (the shared token, or no token).
	Subject    string       `json:"subject,omitempty"`
	Plugin     string       `json:"plugin"`
	SHA256     string       `json:"sha256"`
	Tool       string       `json:"tool"`
	DurationMS float64      `json:"durationMs"`
	IsError    bool         `json:"isError"`
	Refused    bool         `json:"refused,omitempty"`
	Records    []abi.Record `json:"records"`
}

// audit appends a call to the record log, if there is one. res is nil for a
// call that was refused or whose request was cancelled.
func (h *Host) audit(e *callEnv, res *mcp.CallToolResult, start time.Time) {
	if h.opts.RecordLog == nil || e.tool == nil {
		return
	}
	p := e.plugin
	e.mu.Lock()
	records := append([]abi.Record{}, e.records...)
	var subject string
	if e.req != nil {
		subject = subjectOf(e.req.Extra)
	}
	e.mu.Unlock()
	h.writeRecordLog(auditEntry{
		Time: start.UTC(), Session: e.sess, Subject: subject, Plugin: p.Name(), SHA256: p.SHA256(), Tool: e.tool.Name,
		DurationMS: float64(time.Since(start).Microseconds()) / 1000,
		IsError:    res == nil || res.IsError, Refused: res == nil, Records: records,
	})
}

// writeRecordLog appends entry to the record log as one JSON line.
func (h *Host) writeRecordLog(entry any) {
	line, err := json.Marshal(entry)
	if err != nil {
		h.log.Error("record log", "error", err)
		return
	}
	h.auditMu.Lock()
	defer h.auditMu.Unlock()
	if _, err := h.opts.RecordLog.Write(append(line, '\n')); err != nil {
		h.log.Error("record log: write", "error", err)
	}
}
