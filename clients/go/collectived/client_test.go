package collectived

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// sidecarBinary is build/bin/collectived: $COLLECTIVED_BIN, else $COLLECTIVED_BUILD_DIR/bin.
func sidecarBinary(t *testing.T) string {
	if bin := os.Getenv("COLLECTIVED_BIN"); bin != "" {
		return bin
	}
	if dir := os.Getenv("COLLECTIVED_BUILD_DIR"); dir != "" {
		return filepath.Join(dir, "bin", "collectived")
	}
	t.Skip("set COLLECTIVED_BUILD_DIR (or COLLECTIVED_BIN) to run against a real sidecar")
	return ""
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startSidecar runs a real collectived on a private socket and loopback ports; it is stopped
// (SIGTERM, exit status checked) when the test ends. It returns the Unix and TCP addresses.
func startSidecar(t *testing.T) (unixAddr, tcpAddr string) {
	bin := sidecarBinary(t)
	dir, err := os.MkdirTemp("", "cdgo-")
	if err != nil {
		t.Fatal(err)
	}
	socket := filepath.Join(dir, "s.sock")
	tcpAddr = fmt.Sprintf("127.0.0.1:%d", freePort(t))
	logPath := filepath.Join(dir, "sidecar.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--socket", socket, "--listen", tcpAddr, "--advertise", "127.0.0.1",
		"--metrics", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case err := <-exited:
			if err != nil {
				log, _ := os.ReadFile(logPath)
				t.Errorf("sidecar exited with %v:\n%s", err, log)
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("sidecar did not stop")
		}
		logFile.Close()
		os.RemoveAll(dir)
	})
	unixAddr = "unix://" + socket
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(socket); err == nil {
			c, err := Dial(context.Background(), unixAddr, Options{ConnectTimeout: time.Second})
			if err == nil {
				c.Close()
				return unixAddr, tcpAddr
			}
		}
		select {
		case err := <-exited:
			log, _ := os.ReadFile(logPath)
			t.Fatalf("sidecar exited early (%v):\n%s", err, log)
		case <-time.After(50 * time.Millisecond):
		}
	}
	t.Fatalf("sidecar did not come up")
	return "", ""
}

// ranks opens n sessions on addr and joins them to one group named name; closed at the end.
func ranks(t *testing.T, addr, name string, n int) []*Client {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	clients := make([]*Client, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		c, err := Dial(ctx, addr, Options{ClientName: fmt.Sprintf("go test rank %d", r)})
		if err != nil {
			t.Fatal(err)
		}
		clients[r] = c
		t.Cleanup(func() { c.Close() })
		wg.Add(1)
		go func(r int) {
			defer wg.Done()
			_, errs[r] = c.CreateGroup(ctx, GroupOptions{Name: name, Rank: r, WorldSize: n})
		}(r)
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	return clients
}

// onAll runs f(rank) on every rank concurrently and fails on any error.
func onAll(t *testing.T, n int, f func(r int) error) {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := 0; r < n; r++ {
		wg.Add(1)
		go func(r int) { defer wg.Done(); errs[r] = f(r) }(r)
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
}

func wait(w *Work) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return w.Wait(ctx)
}

func TestTensorEncodingIsLittleEndianTorchLayout(t *testing.T) {
	x := Float32s(1, -2.5)
	if !reflect.DeepEqual(x.Data, []byte{0, 0, 0x80, 0x3f, 0, 0, 0x20, 0xc0}) {
		t.Fatalf("float32 bytes %v", x.Data)
	}
	if got := Int64s(-1, 1<<40).Int64s(); !reflect.DeepEqual(got, []int64{-1, 1 << 40}) {
		t.Fatalf("int64 round trip %v", got)
	}
	if x.Count() != 2 || NewTensor(Complex128, 3).Count() != 3 || DTypeSize(BFloat16) != 2 {
		t.Fatal("counts and sizes")
	}
	if _, err := (&Tensor{DType: Int32, Data: make([]byte, 6)}).proto(true); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("ragged tensor: %v", err)
	}
}

// torchNameVectors are the rows of tests/data/torch_names.tsv whose first field is kind: from
// $COLLECTIVED_SOURCE_DIR, else from the source tree around this package (go test's directory).
func torchNameVectors(t *testing.T, kind string) [][]string {
	path := filepath.Join("..", "..", "..", "tests", "data", "torch_names.tsv")
	if dir := os.Getenv("COLLECTIVED_SOURCE_DIR"); dir != "" {
		path = filepath.Join(dir, "tests", "data", "torch_names.tsv")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("the shared vectors: %v", err)
	}
	var rows [][]string
	for _, line := range strings.Split(string(data), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if fields := strings.Split(line, "\t"); fields[0] == kind {
			rows = append(rows, fields)
		}
	}
	if len(rows) == 0 {
		t.Fatalf("no %q rows in %s", kind, path)
	}
	return rows
}

func TestTorchNamesFollowTheSharedVectors(t *testing.T) {
	for _, row := range torchNameVectors(t, "name") {
		var index int
		fmt.Sscan(row[2], &index)
		if got := TorchGroupName(row[1], index, row[3]); got != row[4] {
			t.Errorf("TorchGroupName(%q, %d) = %q, want %q", row[1], index, got, row[4])
		}
	}
	for _, row := range torchNameVectors(t, "job_of") {
		if got := JobOfTorchGroupName(row[1]); got != row[2] {
			t.Errorf("JobOfTorchGroupName(%q) = %q, want %q", row[1], got, row[2])
		}
	}
	for _, row := range torchNameVectors(t, "record") {
		group, address, err := ParseTorchBootstrapRecord(row[1])
		if err != nil || group != row[2] || address != row[3] {
			t.Errorf("ParseTorchBootstrapRecord(%q) = %q, %q, %v", row[1], group, address, err)
		}
	}
	for _, row := range torchNameVectors(t, "bad_record") {
		record := ""
		if len(row) > 1 {
			record = row[1]
		}
		_, _, err := ParseTorchBootstrapRecord(record)
		if KindOf(err) != KindInvalidArgument || !strings.Contains(err.Error(), "NAME|STORE_ADDRESS") {
			t.Errorf("ParseTorchBootstrapRecord(%q): %v", record, err)
		}
	}
}

func TestErrorKindComesFromTheTrailerElseTheCode(t *testing.T) {
	st := status.Error(codes.Unavailable, "rank 3 left group 'g'")
	err := fromRPC(st, metadata.Pairs(ErrorKindMetadataKey, "peer_lost"), "allreduce")
	if !errors.Is(err, ErrPeerLost) || errors.Is(err, ErrUnavailable) {
		t.Fatalf("trailer kind not used: %v", err)
	}
	if err.Error() != "peer_lost: allreduce: rank 3 left group 'g'" {
		t.Fatalf("message %q", err.Error())
	}
	if !errors.Is(fromRPC(st, nil, ""), ErrUnavailable) {
		t.Fatal("code fallback")
	}
	if KindOf(fromRPC(status.Error(codes.DeadlineExceeded, "x"), nil, "")) != KindTimeout {
		t.Fatal("deadline is a timeout")
	}
}

func TestEveryCollectiveInlineOnTwoRanks(t *testing.T) {
	addr, _ := startSidecar(t)
	const n = 2
	cs := ranks(t, addr, "all-ops", n)
	check := func(what string, got, want interface{}) error {
		if !reflect.DeepEqual(got, want) {
			return fmt.Errorf("%s: got %v, want %v", what, got, want)
		}
		return nil
	}
	onAll(t, n, func(r int) error {
		c, g, fr := cs[r], "all-ops", float32(r)
		x := Float32s(fr+1, 10*(fr+1))
		if err := wait(c.AllReduce(g, x, Sum)); err != nil {
			return err
		}
		if err := check("allreduce", x.Float32s(), []float32{3, 30}); err != nil {
			return err
		}
		mx := Int64s(int64(r))
		if err := wait(c.AllReduce(g, mx, Max)); err != nil || mx.Int64s()[0] != 1 {
			return fmt.Errorf("allreduce max %v %v", mx.Int64s(), err)
		}
		a, b := Int32s(int32(r)), Int32s(int32(10*r))
		if err := wait(c.AllReduceCoalesced(g, []*Tensor{a, b}, Sum)); err != nil {
			return err
		}
		if err := check("allreduce_coalesced", []int32{a.Int32s()[0], b.Int32s()[0]}, []int32{1, 10}); err != nil {
			return err
		}
		bc := Float64s(float64(r), 7)
		if err := wait(c.Broadcast(g, bc, 1)); err != nil {
			return err
		}
		if err := check("broadcast", bc.Float64s(), []float64{1, 7}); err != nil {
			return err
		}
		rd := Int32s(int32(r + 1))
		if err := wait(c.Reduce(g, rd, 0, Product)); err != nil {
			return err
		}
		if err := check("reduce", rd.Int32s()[0], map[int]int32{0: 2, 1: 2}[r]); err != nil {
			return err
		}
		outs := []*Tensor{NewTensor(Int32, 2), NewTensor(Int32, 2)}
		if err := wait(c.AllGather(g, outs, Int32s(int32(r), int32(r+100)))); err != nil {
			return err
		}
		if err := check("allgather", [][]int32{outs[0].Int32s(), outs[1].Int32s()}, [][]int32{{0, 100}, {1, 101}}); err != nil {
			return err
		}
		flat := NewTensor(Int64, n)
		if err := wait(c.AllGatherIntoTensor(g, flat, Int64s(int64(r*5)))); err != nil {
			return err
		}
		if err := check("allgather_into_tensor", flat.Int64s(), []int64{0, 5}); err != nil {
			return err
		}
		co := [][]*Tensor{{NewTensor(Int32, 1), NewTensor(Int32, 1)}}
		if err := wait(c.AllGatherCoalesced(g, co, []*Tensor{Int32s(int32(r + 3))})); err != nil {
			return err
		}
		if err := check("allgather_coalesced", []int32{co[0][0].Int32s()[0], co[0][1].Int32s()[0]}, []int32{3, 4}); err != nil {
			return err
		}
		rs := NewTensor(Int32, 1)
		if err := wait(c.ReduceScatter(g, rs, []*Tensor{Int32s(int32(r)), Int32s(int32(10 + r))}, Sum)); err != nil {
			return err
		}
		if err := check("reduce_scatter", rs.Int32s()[0], []int32{1, 21}[r]); err != nil {
			return err
		}
		rst := NewTensor(Float32, 1)
		if err := wait(c.ReduceScatterTensor(g, rst, Float32s(fr, 2*fr), Sum)); err != nil {
			return err
		}
		if err := check("reduce_scatter_tensor", rst.Float32s()[0], []float32{1, 2}[r]); err != nil {
			return err
		}
		ao := []*Tensor{NewTensor(Int32, 1), NewTensor(Int32, 1)}
		if err := wait(c.AllToAll(g, ao, []*Tensor{Int32s(int32(10*r + 0)), Int32s(int32(10*r + 1))})); err != nil {
			return err
		}
		if err := check("alltoall", []int32{ao[0].Int32s()[0], ao[1].Int32s()[0]}, []int32{int32(r), int32(10 + r)}); err != nil {
			return err
		}
		as := NewTensor(Int32, 2)
		if err := wait(c.AllToAllSingle(g, as, Int32s(int32(10*r), int32(10*r+1)), nil, nil)); err != nil {
			return err
		}
		if err := check("alltoall_single", as.Int32s(), []int32{int32(r), int32(10 + r)}); err != nil {
			return err
		}
		var gouts []*Tensor
		if r == 0 {
			gouts = []*Tensor{NewTensor(Int32, 1), NewTensor(Int32, 1)}
		}
		if err := wait(c.Gather(g, Int32s(int32(r+40)), gouts, 0)); err != nil {
			return err
		}
		if r == 0 {
			if err := check("gather", []int32{gouts[0].Int32s()[0], gouts[1].Int32s()[0]}, []int32{40, 41}); err != nil {
				return err
			}
		}
		var sins []*Tensor
		if r == 1 {
			sins = []*Tensor{Int32s(50), Int32s(51)}
		}
		so := NewTensor(Int32, 1)
		if err := wait(c.Scatter(g, so, sins, 1)); err != nil {
			return err
		}
		if err := check("scatter", so.Int32s()[0], int32(50+r)); err != nil {
			return err
		}
		if err := wait(c.Barrier(g)); err != nil {
			return err
		}
		if r == 0 {
			return wait(c.Send(g, Float32s(6, 7), 1, 9))
		}
		in := NewTensor(Float32, 2)
		w := c.Recv(g, in, 0, 9)
		if err := wait(w); err != nil {
			return err
		}
		if w.SourceRank() != 0 {
			return fmt.Errorf("recv source %d", w.SourceRank())
		}
		return check("recv", in.Float32s(), []float32{6, 7})
	})
}

func TestAsyncSubmissionsCompleteInOrder(t *testing.T) {
	addr, _ := startSidecar(t)
	cs := ranks(t, addr, "async", 2)
	onAll(t, 2, func(r int) error {
		var works []*Work
		var ts []*Tensor
		for i := 0; i < 20; i++ {
			x := Int64s(int64(i), int64(r))
			ts = append(ts, x)
			works = append(works, cs[r].AllReduce("async", x, Sum))
		}
		for i, w := range works {
			if err := wait(w); err != nil {
				return err
			}
			if got := ts[i].Int64s(); got[0] != int64(2*i) || got[1] != 1 {
				return fmt.Errorf("op %d: %v", i, got)
			}
			if i > 0 && w.SequenceNumber() != works[i-1].SequenceNumber()+1 {
				return fmt.Errorf("sequence numbers %d then %d", works[i-1].SequenceNumber(), w.SequenceNumber())
			}
			if !w.IsCompleted() || w.Err() != nil {
				return fmt.Errorf("op %d not completed cleanly", i)
			}
		}
		return nil
	})
}

func TestSessionIdIsASecretAndTheLabelIsItsPublicName(t *testing.T) {
	addr, _ := startSidecar(t)
	cs := ranks(t, addr, "labels", 2)
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	label := regexp.MustCompile(`^s[0-9]+$`)
	for _, c := range cs {
		if !hex32.MatchString(c.SessionID()) {
			t.Errorf("session id %q is not 32 hex characters", c.SessionID())
		}
		if !label.MatchString(c.SessionLabel()) || strings.Contains(c.SessionID(), c.SessionLabel()) {
			t.Errorf("label %q of session %q", c.SessionLabel(), c.SessionID())
		}
	}
	if cs[0].SessionID() == cs[1].SessionID() || cs[0].SessionLabel() == cs[1].SessionLabel() {
		t.Errorf("two sessions share an id or a label")
	}
}

func TestTypedErrors(t *testing.T) {
	addr, tcp := startSidecar(t)
	ctx := context.Background()
	c, err := Dial(ctx, tcp) // TCP works as well as the socket
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := wait(c.AllReduce("no-such-group", Float32s(1), Sum)); KindOf(err) != KindInvalidArgument && KindOf(err) != KindNotFound {
		t.Fatalf("unknown group: %v", err)
	}
	if _, err := c.CreateGroup(ctx, GroupOptions{Name: "bad", Rank: 5, WorldSize: 2}); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("rank out of range: %v", err)
	}
	cs := ranks(t, addr, "errs", 2)
	if err := wait(cs[0].Broadcast("errs", Float32s(1), 7)); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("bad root: %v", err)
	}
	// Only rank 0 issues the op: it times out, and the error says so.
	err = wait(cs[0].AllReduce("errs", Float32s(1), Sum, WithTimeout(300*time.Millisecond)))
	var e *Error
	if !errors.Is(err, ErrTimeout) || !errors.As(err, &e) || e.Message == "" {
		t.Fatalf("timeout: %v", err)
	}
	// Wait's own deadline is a timeout too, without failing the op.
	short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancel()
	if err := cs[1].Barrier("errs").Wait(short); !errors.Is(err, ErrTimeout) {
		t.Fatalf("wait deadline: %v", err)
	}
	if _, err := Dial(ctx, "unix:///nonexistent/socket", Options{ConnectTimeout: 300 * time.Millisecond}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no sidecar: %v", err)
	}
}

func TestStore(t *testing.T) {
	_, tcp := startSidecar(t)
	ctx := context.Background()
	c, err := Dial(ctx, tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := c.Store("job")
	if err := s.Set(ctx, "k", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Store("").Get(ctx, "job/k"); err != nil || string(v) != "v" {
		t.Fatalf("prefix: %q %v", v, err)
	}
	if n, err := s.Add(ctx, "n", 5); err != nil || n != 5 {
		t.Fatalf("add: %d %v", n, err)
	}
	if v, err := s.CompareSet(ctx, "k", []byte("v"), []byte("w")); err != nil || string(v) != "w" {
		t.Fatalf("compare_set: %q %v", v, err)
	}
	if err := s.MultiSet(ctx, []string{"a", "b"}, [][]byte{[]byte("1"), []byte("2")}); err != nil {
		t.Fatal(err)
	}
	if vs, err := s.MultiGet(ctx, "a", "b"); err != nil || string(vs[0])+string(vs[1]) != "12" {
		t.Fatalf("multi_get: %q %v", vs, err)
	}
	if err := s.Append(ctx, "a", []byte("x")); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Check(ctx, "a", "b", "k"); err != nil || !ok {
		t.Fatalf("check: %v %v", ok, err)
	}
	if n, err := s.NumKeys(ctx); err != nil || n < 4 {
		t.Fatalf("num_keys: %d %v", n, err)
	}
	if ok, err := s.DeleteKey(ctx, "a"); err != nil || !ok {
		t.Fatalf("delete: %v %v", ok, err)
	}
	ms := int64(100)
	s.Timeout = &ms
	if err := s.Wait(ctx, "missing"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("wait timeout: %v", err)
	}
	if _, err := s.Add(ctx, "k", 1); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("add to text: %v", err)
	}
}

// One sidecar per GPU: {local_rank} in the address picks this trainer's ($LOCAL_RANK), and an
// address naming it without $LOCAL_RANK is refused, saying so.
func TestLocalRankInTheAddressPicksThisTrainersSidecar(t *testing.T) {
	unixAddr, _ := startSidecar(t)
	socket := strings.TrimPrefix(unixAddr, "unix://")
	if err := os.Symlink(socket, filepath.Join(filepath.Dir(socket), "gpu7.sock")); err != nil {
		t.Fatal(err)
	}
	template := "unix://" + filepath.Join(filepath.Dir(socket), "gpu{local_rank}.sock")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	t.Setenv("LOCAL_RANK", "7")
	c, err := Dial(ctx, template, Options{ConnectTimeout: 5 * time.Second})
	if err != nil {
		t.Fatalf("dial %s with LOCAL_RANK=7: %v", template, err)
	}
	c.Close()
	t.Setenv("LOCAL_RANK", "")
	_, err = Dial(ctx, template, Options{ConnectTimeout: 5 * time.Second})
	if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), "LOCAL_RANK") {
		t.Fatalf("dial %s without LOCAL_RANK: %v", template, err)
	}
}

// The client reads its environment through one reader, which knows only the variables of
// rpc/client_environment.h.
func TestTheEnvironmentReaderKnowsOnlyTabledVariables(t *testing.T) {
	t.Setenv("COLLECTIVED_TLS_PEER_NAME", "sidecar.example")
	if got := setting("COLLECTIVED_TLS_PEER_NAME"); got != "sidecar.example" {
		t.Fatalf("setting(COLLECTIVED_TLS_PEER_NAME) = %q", got)
	}
	if got := TLSFromEnvironment().ServerName; got != "sidecar.example" {
		t.Fatalf("TLSFromEnvironment().ServerName = %q", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("setting of a variable outside the table did not panic")
		}
	}()
	setting("COLLECTIVED_NOT_A_CLIENT_VARIABLE")
}
