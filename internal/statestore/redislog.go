package statestore

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/redis/go-redis/v9"
)

// LogRedis sends the Redis client's own log lines (go-redis's: the
// primary a Sentinel names, at the first dial and at each failover; a
// pool's dials that failed) to log, at info level with component=redis,
// rather than to stderr in a format of go-redis's beside the server's
// records; and the store's own about its TLS files (a rotation picked
// up, a bad file kept out). go-redis has one logger for the process: call
// it once, before a store is opened.
func LogRedis(log *slog.Logger) {
	log = log.With("component", "redis")
	redis.SetLogger(redisLog{log})
	tlsLog.Store(log) // the store's own: its TLS files read again
}

// redisLog is go-redis's logger (its internal.Logging) over a slog.Logger.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, args ...any) {
	if ctx == nil {
		ctx = context.Background()
	}
	if l.log.Enabled(ctx, slog.LevelInfo) {
		l.log.InfoContext(ctx, strings.TrimSuffix(fmt.Sprintf(format, args...), "\n"))
	}
}
