package sessions_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/wasmtools/wasmtools/internal/sessions"
)

// BenchmarkWarmLease: n sessions each taking and ending leases on their
// warm instance as fast as they can, all at once, no guest run: the
// manager's own cost of a warm call, and its lock's contention.
func BenchmarkWarmLease(b *testing.B) {
	for _, n := range []int{8, 64, 256} {
		b.Run(fmt.Sprintf("sessions=%d", n), func(b *testing.B) {
			w := newWorld(b, sessions.Options{})
			p := w.plugin("counter")
			keys := make([]sessions.Key, n)
			for i := range keys {
				keys[i] = sessions.Conn(i, fmt.Sprint(i), fmt.Sprint(i))
				l, err := w.m.Acquire(w.ctx, keys[i], p)
				if err != nil {
					b.Fatal(err)
				}
				l.Done(nil)
			}
			var next atomic.Int64
			b.SetParallelism((n + 1) / 2)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := keys[int(next.Add(1)-1)%n]
				for pb.Next() {
					l, err := w.m.Acquire(w.ctx, key, p)
					if err != nil {
						b.Error(err)
						return
					}
					l.Done(nil)
				}
			})
		})
	}
}
