package collectived

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	v1 "github.com/collectived/collectived/clients/go/api/collectived/v1"
)

// Store is a sidecar's rendezvous store with c10d semantics. Keys are namespaced as c10d's
// PrefixStore does: with Prefix "p", key "k" is "p/k" in the store. Timeout applies to the
// blocking calls (Get, Wait, MultiGet): nil = the store's default, 0 = no deadline. A wait that
// expires fails with KindTimeout. Safe for concurrent use.
type Store struct {
	stub    v1.StoreClient
	Prefix  string
	Timeout *int64 // milliseconds
}

// NewStore is the store served at conn (any sidecar's TCP listener or Unix socket).
func NewStore(conn *grpc.ClientConn, prefix string) *Store {
	return &Store{stub: v1.NewStoreClient(conn), Prefix: prefix}
}

// WithPrefix is a view of the same store under Prefix/prefix.
func (s *Store) WithPrefix(prefix string) *Store {
	return &Store{stub: s.stub, Prefix: s.key(prefix), Timeout: s.Timeout}
}

func (s *Store) key(k string) string {
	if s.Prefix == "" {
		return k
	}
	return s.Prefix + "/" + k
}

func (s *Store) keys(ks []string) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = s.key(k)
	}
	return out
}

// Set stores value at key.
func (s *Store) Set(ctx context.Context, key string, value []byte) error {
	var md metadata.MD
	_, err := s.stub.Set(ctx, &v1.StoreSetRequest{Key: s.key(key), Value: value}, grpc.Trailer(&md))
	return fromRPC(err, md, "store set '"+key+"'")
}

// Get blocks until key exists and returns its value.
func (s *Store) Get(ctx context.Context, key string) ([]byte, error) {
	var md metadata.MD
	r, err := s.stub.Get(ctx, &v1.StoreGetRequest{Key: s.key(key), TimeoutMs: s.Timeout}, grpc.Trailer(&md))
	if err != nil {
		return nil, fromRPC(err, md, "store get '"+key+"'")
	}
	return r.Value, nil
}

// Add adds delta to the integer at key (created at 0) and returns the new value.
func (s *Store) Add(ctx context.Context, key string, delta int64) (int64, error) {
	var md metadata.MD
	r, err := s.stub.Add(ctx, &v1.StoreAddRequest{Key: s.key(key), Delta: delta}, grpc.Trailer(&md))
	if err != nil {
		return 0, fromRPC(err, md, "store add '"+key+"'")
	}
	return r.Value, nil
}

// CompareSet is c10d's compare_set; it returns the value now current.
func (s *Store) CompareSet(ctx context.Context, key string, expected, desired []byte) ([]byte, error) {
	var md metadata.MD
	r, err := s.stub.CompareSet(ctx, &v1.StoreCompareSetRequest{Key: s.key(key), Expected: expected,
		Desired: desired}, grpc.Trailer(&md))
	if err != nil {
		return nil, fromRPC(err, md, "store compare_set '"+key+"'")
	}
	return r.Value, nil
}

// Wait blocks until every key exists.
func (s *Store) Wait(ctx context.Context, keys ...string) error {
	var md metadata.MD
	_, err := s.stub.Wait(ctx, &v1.StoreWaitRequest{Keys: s.keys(keys), TimeoutMs: s.Timeout}, grpc.Trailer(&md))
	return fromRPC(err, md, "store wait")
}

// Check reports whether every key exists, without waiting.
func (s *Store) Check(ctx context.Context, keys ...string) (bool, error) {
	var md metadata.MD
	r, err := s.stub.Check(ctx, &v1.StoreCheckRequest{Keys: s.keys(keys)}, grpc.Trailer(&md))
	if err != nil {
		return false, fromRPC(err, md, "store check")
	}
	return r.AllPresent, nil
}

// DeleteKey removes key and reports whether it existed.
func (s *Store) DeleteKey(ctx context.Context, key string) (bool, error) {
	var md metadata.MD
	r, err := s.stub.DeleteKey(ctx, &v1.StoreDeleteKeyRequest{Key: s.key(key)}, grpc.Trailer(&md))
	if err != nil {
		return false, fromRPC(err, md, "store delete_key '"+key+"'")
	}
	return r.Deleted, nil
}

// NumKeys is the number of keys in the whole store (every prefix).
func (s *Store) NumKeys(ctx context.Context) (int64, error) {
	var md metadata.MD
	r, err := s.stub.NumKeys(ctx, &v1.StoreNumKeysRequest{}, grpc.Trailer(&md))
	if err != nil {
		return 0, fromRPC(err, md, "store num_keys")
	}
	return r.NumKeys, nil
}

// MultiGet blocks until every key exists and returns their values in order.
func (s *Store) MultiGet(ctx context.Context, keys ...string) ([][]byte, error) {
	var md metadata.MD
	r, err := s.stub.MultiGet(ctx, &v1.StoreMultiGetRequest{Keys: s.keys(keys), TimeoutMs: s.Timeout}, grpc.Trailer(&md))
	if err != nil {
		return nil, fromRPC(err, md, "store multi_get")
	}
	return r.Values, nil
}

// MultiSet sets several keys atomically.
func (s *Store) MultiSet(ctx context.Context, keys []string, values [][]byte) error {
	var md metadata.MD
	_, err := s.stub.MultiSet(ctx, &v1.StoreMultiSetRequest{Keys: s.keys(keys), Values: values}, grpc.Trailer(&md))
	return fromRPC(err, md, "store multi_set")
}

// Append appends value to the value at key, creating it if missing.
func (s *Store) Append(ctx context.Context, key string, value []byte) error {
	var md metadata.MD
	_, err := s.stub.Append(ctx, &v1.StoreAppendRequest{Key: s.key(key), Value: value}, grpc.Trailer(&md))
	return fromRPC(err, md, "store append '"+key+"'")
}
