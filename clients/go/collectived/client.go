// Package collectived is a Go client of collectived, the collective-communication sidecar.
//
// A Client is one session with a sidecar (the Session.Attach stream, kept open for the
// Client's life): it joins process groups and runs c10d collectives on inline tensors. Every
// collective is asynchronous: it returns a *Work at once, and Work.Wait blocks until the op has
// completed on this rank. Errors are *Error values carrying the sidecar's error kind.
//
//	c, err := collectived.Dial(ctx, "127.0.0.1:7490")
//	defer c.Close()
//	_, err = c.CreateGroup(ctx, collectived.GroupOptions{Name: "g", Rank: r, WorldSize: 4})
//	x := collectived.Float32s(1, 2, 3)
//	err = c.AllReduce("g", x, collectived.Sum).Wait(ctx)  // x now holds the sum over ranks
//
// A Client is safe for concurrent use by multiple goroutines.
package collectived

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"

	v1 "github.com/collectived/collectived/clients/go/api/collectived/v1"
)

// AddressEnv names the environment variable Dial reads when given no address.
const AddressEnv = "COLLECTIVED_ADDRESS"

// DefaultAddress is the sidecar's default Unix socket.
const DefaultAddress = "unix:///run/collectived/collectived.sock"

// LocalRankPlaceholder in an address stands for $LOCAL_RANK, for nodes that run one sidecar per
// GPU: COLLECTIVED_ADDRESS=unix:///run/collectived/gpu{local_rank}.sock serves every trainer.
const LocalRankPlaceholder = "{local_rank}"

// withLocalRank replaces LocalRankPlaceholder by $LOCAL_RANK when that is a decimal number.
func withLocalRank(address string) string {
	localRank := os.Getenv("LOCAL_RANK")
	if localRank == "" || len(localRank) > 9 || strings.Trim(localRank, "0123456789") != "" {
		return address
	}
	return strings.ReplaceAll(address, LocalRankPlaceholder, localRank)
}

const maxMessageBytes = 64 << 20

// Options configure Dial. The zero value is valid.
type Options struct {
	// ClientName labels the session in the sidecar's logs and admin API.
	ClientName string
	// ConnectTimeout bounds connecting and opening the session; 0 = 10 s.
	ConnectTimeout time.Duration
	// TLS to a TCP address (a Unix socket is always plaintext); nil = from the environment
	// ($COLLECTIVED_TLS_CA, _CERT, _KEY, _PEER_NAME, as the sidecar reads them).
	TLS *TLSOptions
}

// TLSOptions are the PEM files of a TLS client. All empty: plaintext.
type TLSOptions struct {
	CA         string // CA that signed the sidecar's certificate; "" = the system's roots
	Cert       string // client certificate (mutual TLS), with Key
	Key        string
	ServerName string // name expected in the sidecar's certificate; "" = the address's host
}

// TLSFromEnvironment reads $COLLECTIVED_TLS_CA, _CERT, _KEY and _PEER_NAME.
func TLSFromEnvironment() TLSOptions {
	return TLSOptions{CA: setting("COLLECTIVED_TLS_CA"), Cert: setting("COLLECTIVED_TLS_CERT"),
		Key: setting("COLLECTIVED_TLS_KEY"), ServerName: setting("COLLECTIVED_TLS_PEER_NAME")}
}

// transportCredentials builds the gRPC credentials of t (nil when no file is given).
func (t TLSOptions) transportCredentials() (credentials.TransportCredentials, error) {
	if t.CA == "" && t.Cert == "" && t.Key == "" {
		return nil, nil
	}
	bad := func(message string) error {
		return &Error{Kind: KindInvalidArgument, Rank: -1, Message: message}
	}
	config := &tls.Config{ServerName: t.ServerName, MinVersion: tls.VersionTLS12}
	if t.CA != "" {
		pem, err := os.ReadFile(t.CA)
		if err != nil {
			return nil, bad("TLS CA file " + t.CA + ": cannot read it: " + err.Error())
		}
		config.RootCAs = x509.NewCertPool()
		if !config.RootCAs.AppendCertsFromPEM(pem) {
			return nil, bad("TLS CA file " + t.CA + ": no PEM certificate in it")
		}
	}
	if (t.Cert == "") != (t.Key == "") {
		return nil, bad("a TLS client certificate and its key come together")
	}
	if t.Cert != "" {
		pair, err := tls.LoadX509KeyPair(t.Cert, t.Key)
		if err != nil {
			return nil, bad("TLS client certificate " + t.Cert + " / key " + t.Key + ": " + err.Error())
		}
		config.Certificates = []tls.Certificate{pair}
	}
	return credentials.NewTLS(config), nil
}

// GroupOptions describe a group to join (CreateGroupRequest).
type GroupOptions struct {
	Name         string        // unique among the job's live groups
	Rank         int           // the caller's global rank, in [0, WorldSize)
	WorldSize    int           // ranks of the global world
	Members      []int         // global ranks of a subgroup; nil = all of [0, WorldSize)
	StoreAddress string        // host:port of the rendezvous store; "" = the local sidecar
	StorePrefix  string        // key prefix of the rendezvous in that store
	Timeout      time.Duration // default of the group's ops and of the rendezvous; 0 = 30 min
	JobToken     string        // optional shared secret of the job's members
	// Shrink: the group goes on among its live ranks when it loses one, down to MinRanks
	// (docs/fault-tolerance.md); every member must ask for the same. False: fail fast.
	Shrink   bool
	MinRanks int
}

// GroupInfo is what CreateGroup answers: group rank and size, sorted members, placement.
type GroupInfo = v1.CreateGroupResponse

// Client is a session with one sidecar. Safe for concurrent use.
type Client struct {
	address      string
	conn         *grpc.ClientConn
	session      v1.SessionClient
	groups       v1.GroupsClient
	admin        v1.AdminClient
	store        v1.StoreClient
	stream       v1.Session_AttachClient
	cancel       context.CancelFunc
	sessionID    string
	sessionLabel string
	sidecarID    string
	readerDone   chan struct{}

	sendMu sync.Mutex // grpc-go streams allow one sender at a time

	mu      sync.Mutex
	pending map[uint64]*Work
	nextID  uint64
	joined  map[string]bool
	lost    error
	closed  bool
}

// Dial connects to the sidecar at address ("unix:///path", "unix:/path" or "host:port"; "" =
// $COLLECTIVED_ADDRESS, else DefaultAddress; LocalRankPlaceholder replaced) and opens a session. It returns an *Error of kind
// KindUnavailable when the sidecar cannot be reached within the connect timeout.
func Dial(ctx context.Context, address string, opts ...Options) (*Client, error) {
	var o Options
	if len(opts) > 0 {
		o = opts[0]
	}
	if o.ConnectTimeout <= 0 {
		o.ConnectTimeout = 10 * time.Second
	}
	if o.ClientName == "" {
		o.ClientName = fmt.Sprintf("go pid %d", os.Getpid())
	}
	if address == "" {
		address = setting(AddressEnv)
	}
	if address == "" {
		address = DefaultAddress
	}
	address = withLocalRank(address)
	tlsOptions := TLSFromEnvironment()
	if o.TLS != nil {
		tlsOptions = *o.TLS
	}
	conn, err := dialConn(ctx, address, tlsOptions)
	if err != nil {
		return nil, err
	}
	c := &Client{address: address, conn: conn, session: v1.NewSessionClient(conn),
		groups: v1.NewGroupsClient(conn), admin: v1.NewAdminClient(conn),
		store: v1.NewStoreClient(conn), pending: map[uint64]*Work{}, joined: map[string]bool{},
		readerDone: make(chan struct{})}
	streamCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	if c.stream, err = c.session.Attach(streamCtx); err != nil {
		cancel()
		conn.Close()
		return nil, fromRPC(err, nil, "attach to "+address)
	}
	open := &v1.SessionRequest{Kind: &v1.SessionRequest_Open{Open: &v1.OpenSession{
		ClientName: o.ClientName, Pid: int64(os.Getpid())}}}
	if err := c.stream.Send(open); err != nil {
		cancel()
		conn.Close()
		return nil, fromRPC(err, nil, "attach to "+address)
	}
	first := make(chan error, 1)
	go func() {
		event, err := c.stream.Recv()
		if err != nil {
			first <- fromRPC(err, c.stream.Trailer(), "attach to "+address)
			return
		}
		opened := event.GetOpened()
		if opened == nil {
			first <- &Error{Kind: KindInternal, Rank: -1, Message: "the sidecar at " + address + " did not open a session"}
			return
		}
		c.sessionID, c.sidecarID = opened.SessionId, opened.SidecarId
		c.sessionLabel = opened.SessionLabel
		first <- nil
	}()
	timer := time.NewTimer(o.ConnectTimeout)
	defer timer.Stop()
	select {
	case err = <-first:
	case <-timer.C:
		err = &Error{Kind: KindUnavailable, Rank: -1, Message: fmt.Sprintf(
			"the sidecar at %s did not answer within %v (is collectived running?)", address, o.ConnectTimeout)}
	case <-ctx.Done():
		err = fromRPC(ctx.Err(), nil, "attach to "+address)
	}
	if err != nil {
		cancel()
		conn.Close()
		return nil, err
	}
	go c.readEvents()
	return c, nil
}

func dialConn(ctx context.Context, address string, tlsOptions TLSOptions) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{grpc.WithInsecure(), grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(maxMessageBytes), grpc.MaxCallSendMsgSize(maxMessageBytes))}
	target := address
	if strings.Contains(address, LocalRankPlaceholder) {
		return nil, &Error{Kind: KindInvalidArgument, Rank: -1, Message: "bad address " + address + ": it names " + LocalRankPlaceholder + " but $LOCAL_RANK is not set to a number (one sidecar per GPU: set LOCAL_RANK, as torchrun does)"}
	}
	if strings.HasPrefix(address, "unix:") {
		path := strings.TrimPrefix(strings.TrimPrefix(address, "unix:"), "//")
		if !strings.HasPrefix(path, "/") {
			return nil, &Error{Kind: KindInvalidArgument, Rank: -1, Message: "bad address " + address + ": want unix:///absolute/path"}
		}
		target = "passthrough:///unix"
		opts = append(opts, grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		}))
	} else if _, _, err := net.SplitHostPort(address); err != nil {
		return nil, &Error{Kind: KindInvalidArgument, Rank: -1, Message: "bad address " + address + ": want unix:///path or host:port"}
	} else if creds, err := tlsOptions.transportCredentials(); err != nil {
		return nil, err
	} else if creds != nil {
		opts[0] = grpc.WithTransportCredentials(creds)
	}
	conn, err := grpc.DialContext(ctx, target, opts...)
	if err != nil {
		return nil, fromRPC(err, nil, "connect to "+address)
	}
	return conn, nil
}

// Address is the sidecar's address as given to Dial (after defaults).
func (c *Client) Address() string { return c.address }

// SessionID is the session's id, which every request of this session carries. It is a secret
// (the session is usable only from this client's connection, but do not show it): log
// SessionLabel instead.
func (c *Client) SessionID() string { return c.sessionID }

// SessionLabel is the session's public name ("s17"), as the sidecar's logs and errors show it.
func (c *Client) SessionLabel() string { return c.sessionLabel }

// SidecarID identifies the sidecar (host and listen address).
func (c *Client) SidecarID() string { return c.sidecarID }

// Conn is the underlying connection, for calling other services of the API (Admin, health).
func (c *Client) Conn() *grpc.ClientConn { return c.conn }

func (c *Client) readEvents() {
	defer close(c.readerDone)
	var reason error
	for {
		event, err := c.stream.Recv()
		if err != nil {
			c.mu.Lock()
			closed := c.closed
			c.mu.Unlock()
			if reason == nil {
				if closed {
					reason = &Error{Kind: KindAborted, Rank: -1, Message: "the client closed its session"}
				} else {
					reason = fromRPC(err, c.stream.Trailer(), "session to "+c.address+" lost")
				}
			}
			break
		}
		switch kind := event.Kind.(type) {
		case *v1.SessionEvent_Completion:
			c.mu.Lock()
			work := c.pending[kind.Completion.ClientOpId]
			delete(c.pending, kind.Completion.ClientOpId)
			c.mu.Unlock()
			if work != nil {
				work.complete(kind.Completion, nil)
			}
		case *v1.SessionEvent_Closing:
			reason = fromProto(kind.Closing, "the sidecar closed the session")
		}
	}
	c.mu.Lock()
	c.lost = reason
	pending := c.pending
	c.pending = map[uint64]*Work{}
	c.mu.Unlock()
	for _, work := range pending {
		work.complete(nil, reason)
	}
}

// Close leaves the groups this client joined, ends the session (pending ops fail with
// KindAborted) and closes the connection. Idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	names := make([]string, 0, len(c.joined))
	for name := range c.joined {
		names = append(names, name)
	}
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Leaving the groups first tells the sidecar this is a clean exit, not a lost rank.
	for _, name := range names {
		_ = c.DestroyGroup(ctx, name)
	}
	c.sendMu.Lock()
	_ = c.stream.CloseSend()
	c.sendMu.Unlock()
	select {
	case <-c.readerDone:
	case <-ctx.Done():
	}
	c.cancel()
	return c.conn.Close()
}

// CreateGroup joins the calling rank to a group; it returns when every member has joined through
// its own sidecar, or fails (KindTimeout naming the ranks that never arrived).
func (c *Client) CreateGroup(ctx context.Context, o GroupOptions) (*GroupInfo, error) {
	members := make([]int32, len(o.Members))
	for i, m := range o.Members {
		members[i] = int32(m)
	}
	req := &v1.CreateGroupRequest{SessionId: c.sessionID, Name: o.Name, Rank: int32(o.Rank),
		WorldSize: int32(o.WorldSize), Members: members, StoreAddress: o.StoreAddress,
		StorePrefix: o.StorePrefix, TimeoutMs: o.Timeout.Milliseconds(), JobToken: o.JobToken}
	if o.Shrink {
		req.FaultTolerance = &v1.FaultTolerance{Mode: v1.FaultTolerance_SHRINK,
			MinRanks: int32(o.MinRanks)}
	}
	var trailer metadata.MD
	info, err := c.groups.CreateGroup(ctx, req, grpc.Trailer(&trailer))
	if err != nil {
		return nil, fromRPC(err, trailer, fmt.Sprintf("create group '%s'", o.Name))
	}
	c.mu.Lock()
	c.joined[o.Name] = true
	c.mu.Unlock()
	return info, nil
}

// DestroyGroup leaves a group; this rank's pending ops on it fail with KindAborted.
func (c *Client) DestroyGroup(ctx context.Context, name string) error {
	c.mu.Lock()
	delete(c.joined, name)
	c.mu.Unlock()
	var trailer metadata.MD
	_, err := c.groups.DestroyGroup(ctx, &v1.DestroyGroupRequest{SessionId: c.sessionID, Group: name},
		grpc.Trailer(&trailer))
	return fromRPC(err, trailer, fmt.Sprintf("destroy group '%s'", name))
}

// SidecarInfo is the sidecar's Admin.GetInfo answer (version, advertised address, groups...).
func (c *Client) SidecarInfo(ctx context.Context) (*v1.SidecarInfo, error) {
	var trailer metadata.MD
	info, err := c.admin.GetInfo(ctx, &v1.GetInfoRequest{}, grpc.Trailer(&trailer))
	return info, fromRPC(err, trailer, "sidecar info")
}

// Store is the rendezvous store of this client's sidecar, with keys under prefix ("" = none).
func (c *Client) Store(prefix string) *Store { return &Store{stub: c.store, Prefix: prefix} }

// OpOption adjusts one collective.
type OpOption func(*v1.CollectiveRequest)

// WithTimeout sets the op's timeout (default: the group's).
func WithTimeout(d time.Duration) OpOption {
	return func(r *v1.CollectiveRequest) { r.TimeoutMs = d.Milliseconds() }
}

// submit sends one collective on the session stream; writeback are the tensors that receive
// the response's inline outputs, by index.
func (c *Client) submit(group, op string, writeback []*Tensor, buildErr error,
	set func(*v1.CollectiveRequest), opts []OpOption) *Work {
	c.mu.Lock()
	c.nextID++
	id := c.nextID
	work := &Work{Op: op, Group: group, ClientOpID: id, writeback: writeback, done: make(chan struct{})}
	if buildErr != nil {
		c.mu.Unlock()
		work.complete(nil, buildErr)
		return work
	}
	if c.lost != nil || c.closed {
		err := c.lost
		if err == nil {
			err = &Error{Kind: KindAborted, Rank: -1, Message: "the client is closed"}
		}
		c.mu.Unlock()
		work.complete(nil, err)
		return work
	}
	c.pending[id] = work
	c.mu.Unlock()
	req := &v1.CollectiveRequest{SessionId: c.sessionID, Group: group, ClientOpId: id}
	set(req)
	for _, opt := range opts {
		opt(req)
	}
	c.sendMu.Lock()
	err := c.stream.Send(&v1.SessionRequest{Kind: &v1.SessionRequest_Submit{Submit: req}})
	c.sendMu.Unlock()
	if err != nil {
		c.mu.Lock()
		delete(c.pending, id)
		c.mu.Unlock()
		work.complete(nil, &Error{Kind: KindUnavailable, Rank: -1,
			Message: fmt.Sprintf("%s on group '%s': session to %s lost", op, group, c.address)})
	}
	return work
}

// Work is the handle of one submitted collective (c10d's Work). Safe for concurrent use.
type Work struct {
	Op         string // op name as torch spells it
	Group      string
	ClientOpID uint64

	writeback []*Tensor
	done      chan struct{}
	once      sync.Once
	response  *v1.CollectiveResponse
	err       error
}

func (w *Work) complete(response *v1.CollectiveResponse, err error) {
	w.once.Do(func() {
		w.response = response
		if err == nil && response != nil {
			err = fromProto(response.Error, "")
			if err == nil {
				err = w.applyWriteback(response.Outputs)
			}
		}
		w.err = err
		close(w.done)
	})
}

func (w *Work) applyWriteback(outputs [][]byte) error {
	// Every size is checked before anything is written, so a bad response leaves the caller's
	// tensors alone. Only reduce may return nothing: a non-root rank's tensor is an input only.
	for i, t := range w.writeback {
		if t == nil {
			continue
		}
		if w.Op == "reduce" && (i >= len(outputs) || len(outputs[i]) == 0) {
			continue
		}
		if i >= len(outputs) {
			return &Error{Kind: KindInternal, Rank: -1, Message: fmt.Sprintf(
				"%s: the sidecar returned %d outputs, expected output %d", w.Op, len(outputs), i)}
		}
		if len(outputs[i]) != len(t.Data) {
			return &Error{Kind: KindInternal, Rank: -1, Message: fmt.Sprintf(
				"%s: output %d has %d bytes, expected %d", w.Op, i, len(outputs[i]), len(t.Data))}
		}
	}
	for i, t := range w.writeback {
		if t != nil && i < len(outputs) {
			copy(t.Data, outputs[i])
		}
	}
	return nil
}

// Done is closed when the op has completed (successfully or not).
func (w *Work) Done() <-chan struct{} { return w.done }

// IsCompleted reports whether the op has completed.
func (w *Work) IsCompleted() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// Wait blocks until the op completes and returns its error (an *Error), or until ctx ends, in
// which case it returns an *Error of KindTimeout (the op keeps running until its own timeout).
func (w *Work) Wait(ctx context.Context) error {
	select {
	case <-w.done:
		return w.err
	case <-ctx.Done():
		return &Error{Kind: KindTimeout, Rank: -1, Message: fmt.Sprintf(
			"Timeout: %s (client op %d) on group '%s' did not complete: %v", w.Op, w.ClientOpID, w.Group, ctx.Err())}
	}
}

// Err is the op's error once it has completed (nil before).
func (w *Work) Err() error {
	if !w.IsCompleted() {
		return nil
	}
	return w.err
}

// Response is the sidecar's CollectiveResponse once completed (nil before, or when the op
// failed without one).
func (w *Work) Response() *v1.CollectiveResponse {
	if !w.IsCompleted() {
		return nil
	}
	return w.response
}

// SequenceNumber is the op's sequence number in its group (0 before completion, and for
// send/recv).
func (w *Work) SequenceNumber() uint64 {
	if r := w.Response(); r != nil {
		return r.SequenceNumber
	}
	return 0
}

// SourceRank is the group rank a Recv's data came from (-1 before completion).
func (w *Work) SourceRank() int {
	if r := w.Response(); r != nil {
		return int(r.SourceRank)
	}
	return -1
}
