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
	group, storeAddress, err := ParseTorchBootstrapRecord(string(record))
	if err != nil {
		return "", nil, err
	}
	info, err := c.CreateGroup(ctx, GroupOptions{Name: group, Rank: j.Rank, WorldSize: j.WorldSize,
		StoreAddress: storeAddress, Timeout: j.Timeout})
	if err != nil {
		return "", nil, err
	}
	if j.BarrierKey != "" {
		if _, err := j.Store.Add(ctx, j.BarrierKey, 1); err != nil {
			return "", nil, err
		}
	}
	return group, info, nil
}

// The torch backend's group-name grammar and bootstrap record, as rpc/torch_names.h and
// collectived/torch_names.py have them (tests/data/torch_names.tsv holds the vectors all three
// are tested against).

// TorchGroupName is the name of process group index of job: "<job>-pg<index>-<randomHex>",
// the job's bytes other than ASCII letters, digits, '.', '_' and '-' made '-', at most 64 of
// them, no leading or trailing '-'; "pg-<randomHex>" when nothing of the job is left.
func TorchGroupName(job string, index int, randomHex string) string {
	if len(job) > 64 {
		job = job[:64]
	}
	part := []byte(job)
	for i, c := range part {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' ||
			c == '_' || c == '-') {
			part[i] = '-'
		}
	}
	trimmed := strings.Trim(string(part), "-")
	if trimmed == "" {
		return "pg-" + randomHex
	}
	return fmt.Sprintf("%s-pg%d-%s", trimmed, index, randomHex)
}

// JobOfTorchGroupName is the job of a group named "<job>-pg<digits>-<hex>", else "".
func JobOfTorchGroupName(group string) string {
	dash := strings.LastIndexByte(group, '-')
	if dash < 0 || dash+1 == len(group) || !allBytes(group[dash+1:], isHexDigit) {
		return ""
	}
	pg := strings.LastIndex(group[:dash], "-pg")
	if pg <= 0 || pg+3 == dash || !allBytes(group[pg+3:dash], isDigit) {
		return ""
	}
	return group[:pg]
}

// ParseTorchBootstrapRecord splits a bootstrap record "NAME|STORE_ADDRESS" at its first '|'; an
// InvalidArgument *Error quoting it when it has no '|', an empty name or an empty address.
func ParseTorchBootstrapRecord(record string) (group, storeAddress string, err error) {
	parts := strings.SplitN(record, "|", 2)
	if len(parts) != 2 || parts[0] == "" || parts[1] == "" {
		return "", "", &Error{Kind: KindInvalidArgument, Rank: -1,
			Message: fmt.Sprintf("bad torch bootstrap record '%s' at %s (want NAME|STORE_ADDRESS)",
				record, TorchBootstrapKey)}
	}
	return parts[0], parts[1], nil
}

func isDigit(c byte) bool    { return c >= '0' && c <= '9' }
func isHexDigit(c byte) bool { return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' }

func allBytes(text string, ok func(byte) bool) bool {
	for i := 0; i < len(text); i++ {
		if !ok(text[i]) {
			return false
		}
	}
	return true
}
