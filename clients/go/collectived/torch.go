package collectived

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// TorchBootstrapKey is the key, under the torch group's store prefix, where rank 0 of a group
// made by the Python "collectived" torch.distributed backend publishes "NAME|STORE_ADDRESS":
// the group's name in the sidecars and the address of the store the sidecars meet in.
const TorchBootstrapKey = "collectived/bootstrap"

// TorchJoin describes how a non-torch rank joins a process group that PyTorch trainers create
// with init_process_group("collectived", store=collectived.torch.Store(ADDRESS), ...).
type TorchJoin struct {
	// Store is the store torch was given (the same sidecar store, no prefix of its own).
	Store *Store
	// GroupPrefix is torch's name of the group, which prefixes its keys: "0" for the default
	// group in torch 1.13 (PrefixStore("0", store)).
	GroupPrefix string
	Rank        int
	WorldSize   int
	// BarrierKey, when not empty, is the counter of torch's store-based barrier that closes
	// init_process_group ("store_based_barrier_key:1" in torch 1.13): this rank adds itself.
	BarrierKey string
	Timeout    time.Duration // the group's default op timeout; 0 = 30 minutes
}

// JoinTorchGroup reads the group's bootstrap record, joins the group as j.Rank and checks in
// at torch's barrier. It returns the group's name in the sidecars (for the collectives).
func (c *Client) JoinTorchGroup(ctx context.Context, j TorchJoin) (string, *GroupInfo, error) {
	store := j.Store.WithPrefix(j.GroupPrefix)
	record, err := store.Get(ctx, TorchBootstrapKey)
	if err != nil {
		return "", nil, err
	}
	parts := strings.SplitN(string(record), "|", 2)
	if len(parts) != 2 {
		return "", nil, &Error{Kind: KindInvalidArgument, Rank: -1,
			Message: fmt.Sprintf("bad bootstrap record %q (want NAME|STORE_ADDRESS)", record)}
	}
	info, err := c.CreateGroup(ctx, GroupOptions{Name: parts[0], Rank: j.Rank, WorldSize: j.WorldSize,
		StoreAddress: parts[1], Timeout: j.Timeout})
	if err != nil {
		return "", nil, err
	}
	if j.BarrierKey != "" {
		if _, err := j.Store.Add(ctx, j.BarrierKey, 1); err != nil {
			return "", nil, err
		}
	}
	return parts[0], info, nil
}
