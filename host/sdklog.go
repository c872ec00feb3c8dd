package host

import (
	"context"
	"log/slog"
)

// sdkLogger is the logger the go-sdk's server and handlers get: the
// host's, through [sdkLogHandler].
func (h *Host) sdkLogger(component string) *slog.Logger {
	return slog.New(sdkLogHandler{h.log.Handler()}).With("component", component)
}

// sdkLogHandler passes the go-sdk's log records on with two changes:
//   - a "session_id" attribute is replaced by the session's label (a
//     digest): a stateful session's ID is a credential, and the go-sdk
//     logs it raw when a session connects, disconnects and subscribes;
//   - the go-sdk's per-connection lines ("server connecting", "server
//     session connected" and "disconnected", "session initialized") are
//     Debug, not Info: a 2026-07-28 request is a connection of its own,
//     so at Info they were three lines for every request.
type sdkLogHandler struct{ next slog.Handler }

// sdkConnectionLines are the go-sdk's messages demoted to Debug.
var sdkConnectionLines = map[string]bool{
	"server connecting":           true,
	"server session connected":    true,
	"server session disconnected": true,
	"session initialized":         true,
	"server session ended":        true,
}

func (s sdkLogHandler) Enabled(ctx context.Context, l slog.Level) bool {
	// The level of a demoted line is known only with its message: let
	// Info through here, and Handle checks again.
	return s.next.Enabled(ctx, l) || l == slog.LevelInfo && s.next.Enabled(ctx, slog.LevelDebug)
}

func (s sdkLogHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level == slog.LevelInfo && sdkConnectionLines[r.Message] {
		r.Level = slog.LevelDebug
	}
	if !s.next.Enabled(ctx, r.Level) {
		return nil
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "session_id" {
			if id := a.Value.String(); id != "" {
				a = slog.String("session", sessionLabel(id))
			}
		}
		out.AddAttrs(a)
		return true
	})
	return s.next.Handle(ctx, out)
}

func (s sdkLogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return sdkLogHandler{s.next.WithAttrs(as)}
}

func (s sdkLogHandler) WithGroup(name string) slog.Handler {
	return sdkLogHandler{s.next.WithGroup(name)}
}
