// Command collectived-go-example is the Go rank of a mixed-language job: it joins a group that
// PyTorch trainers create through the "collectived" torch.distributed backend (examples/go/
// torch_rank.py) beside a C++ rank (examples/cpp/mixed_rank.cc), and runs the same collectives
// with inline tensors, checking every result exactly.
//
//	collectived-go-example -address unix:///tmp/b.sock -store 127.0.0.1:7490 -rank 2
//	collectived-go-example -address unix:///tmp/b.sock -bench 2000   # 8-byte allreduce latency
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"reflect"
	"sort"
	"time"

	"github.com/collectived/collectived/clients/go/collectived"
)

func main() {
	address := flag.String("address", "", "this rank's sidecar (default $COLLECTIVED_ADDRESS)")
	storeAddress := flag.String("store", "", "host:port of the store torch was given")
	rank := flag.Int("rank", -1, "global rank")
	worldSize := flag.Int("world-size", 4, "ranks in the job")
	prefix := flag.String("torch-prefix", "0", "torch's name of the group (its store prefix)")
	bench := flag.Int("bench", 0, "instead: time this many world-1 8-byte allreduces")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	client, err := collectived.Dial(ctx, *address)
	if err != nil {
		fail(err)
	}
	defer client.Close()
	if *bench > 0 {
		runBench(ctx, client, *bench)
		return
	}
	if *rank < 0 || *storeAddress == "" {
		fail(fmt.Errorf("-rank and -store are required"))
	}
	storeConn, err := collectived.Dial(ctx, *storeAddress)
	if err != nil {
		fail(err)
	}
	defer storeConn.Close()
	group, _, err := client.JoinTorchGroup(ctx, collectived.TorchJoin{
		Store: storeConn.Store(""), GroupPrefix: *prefix, Rank: *rank, WorldSize: *worldSize,
		BarrierKey: "store_based_barrier_key:1", Timeout: 2 * time.Minute})
	if err != nil {
		fail(err)
	}
	r := *rank
	// allreduce: rank r contributes (r + 1) * (i + 1); the sum over n ranks is n(n+1)/2 * (i + 1).
	x := collectived.Float32s(float32(r+1), float32(2*(r+1)), float32(3*(r+1)), float32(4*(r+1)))
	must(client.AllReduce(group, x, collectived.Sum).Wait(ctx))
	s := float32(*worldSize*(*worldSize+1)) / 2
	expect("allreduce", x.Float32s(), []float32{s, 2 * s, 3 * s, 4 * s})
	// broadcast from every root in turn: everyone ends with root * 10 + i.
	for root := 0; root < *worldSize; root++ {
		b := collectived.Int64s(int64(r*10), int64(r*10+1), int64(r*10+2))
		must(client.Broadcast(group, b, root).Wait(ctx))
		expect(fmt.Sprintf("broadcast from %d", root), b.Int64s(),
			[]int64{int64(root * 10), int64(root*10 + 1), int64(root*10 + 2)})
	}
	// all_gather: rank k contributes {k, k * k}.
	outs := make([]*collectived.Tensor, *worldSize)
	for k := range outs {
		outs[k] = collectived.NewTensor(collectived.Int32, 2)
	}
	must(client.AllGather(group, outs, collectived.Int32s(int32(r), int32(r*r))).Wait(ctx))
	for k, out := range outs {
		expect(fmt.Sprintf("all_gather[%d]", k), out.Int32s(), []int32{int32(k), int32(k * k)})
	}
	must(client.Barrier(group).Wait(ctx))
	fmt.Printf("go rank %d: allreduce, broadcast x%d, all_gather ok\n", r, *worldSize)
}

// runBench times n blocking 8-byte (one float64) inline allreduces on a world-1 group.
func runBench(ctx context.Context, client *collectived.Client, n int) {
	_, err := client.CreateGroup(ctx, collectived.GroupOptions{Name: "bench-go", Rank: 0, WorldSize: 1})
	must(err)
	x := collectived.Float64s(1)
	var micros []float64
	for i := 0; i < n+100; i++ {
		start := time.Now()
		must(client.AllReduce("bench-go", x, collectived.Sum).Wait(ctx))
		if i >= 100 {
			micros = append(micros, float64(time.Since(start).Nanoseconds())/1000)
		}
	}
	sort.Float64s(micros)
	fmt.Printf("go inline allreduce 8 B: median %.1f us, p90 %.1f us over %d ops\n",
		micros[len(micros)/2], micros[len(micros)*9/10], n)
}

func expect(what string, got, want interface{}) {
	if !reflect.DeepEqual(got, want) {
		fail(fmt.Errorf("%s: got %v, want %v", what, got, want))
	}
}

func must(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "go rank: %v\n", err)
	os.Exit(1)
}
