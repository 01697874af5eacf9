package router_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dflash/dflash_server/core/metrics"
	"github.com/dflash/dflash_server/core/router"
	"github.com/dflash/dflash_server/plugins/policy-by-name/byname"
	"github.com/dflash/dflash_server/sdk"
	"github.com/dflash/dflash_server/sdk/sdktest"
)

// BenchmarkRouterOverhead measures Router.Start for one request while
// `waiting` other requests sit in the queue: policy call, snapshot, ticket,
// the FIFO check, the fallback decision and the backend attempt up to its
// admission. The primary "a" has one slot, held for the whole benchmark,
// and the waiters are pinned to it (by-name policy); the measured requests
// are unpinned, skip a for the waiters' sake and are admitted by "b", an
// in-process backend that admits at once. Start's latency is reported as
// p50/p99 in µs; the drain and Close after it are not timed.
func BenchmarkRouterOverhead(b *testing.B) {
	for _, waiting := range []int{1, 64, 1024} {
		b.Run(fmt.Sprintf("waiting=%d", waiting), func(b *testing.B) { benchOverhead(b, waiting, false) })
	}
	b.Run("waiting=1/policy-over-grpc", func(b *testing.B) { benchOverhead(b, 1, true) })
}

func benchOverhead(b *testing.B, waiting int, grpcPolicy bool) {
	a, fast := newScripted("a", 1, 1<<30), newScripted("b", 1<<20, 1<<30)
	fast.auto = true
	var policy sdk.Policy = byname.New()
	if grpcPolicy {
		policy = sdktest.Policy(b, policy)
	}
	r := router.New(router.Config{
		LoadBalancing: true, QueueLimit: waiting + 1, Policy: policy, PolicyName: byname.Name,
		Metrics: metrics.New(metrics.Options{}), Retry: time.Hour,
	}, []*router.Model{
		{Name: "a", Backend: a, Desc: a.desc()},
		{Name: "b", Backend: fast, Desc: fast.desc()},
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hold, err := r.Start(ctx, chat("hold", 1, 1))
	if err != nil {
		b.Fatal(err)
	}
	holdRun := <-a.runs
	done := make(chan struct{}, waiting)
	for i := 0; i < waiting; i++ {
		req := chat(fmt.Sprint("w", i), 1, 1)
		req.Model = "a"
		go func() {
			if s, err := r.Start(ctx, req); err == nil {
				s.Close()
			}
			done <- struct{}{}
		}()
	}
	for r.Status().Waiting != waiting {
		time.Sleep(time.Millisecond)
	}
	req := chat("m", 1, 1)
	lat := make([]time.Duration, 0, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		s, err := r.Start(ctx, req)
		lat = append(lat, time.Since(t0))
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		for {
			if _, err := s.Recv(ctx); err != nil {
				break
			}
		}
		s.Close()
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
	cancel()
	for i := 0; i < waiting; i++ {
		<-done
	}
	holdRun.all()
	hold.Close()
}
