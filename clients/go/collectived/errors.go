package collectived

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/collectived/collectived/clients/go/api/collectived/v1"
)

// ErrorKindMetadataKey is the trailing metadata in which the sidecar names the kind of a failed
// call: Kind.String() of one of the kinds ("invalid_argument", "timeout", "peer_lost", ...).
const ErrorKindMetadataKey = "collectived-error-kind"

// Kind is one of the error kinds a client can act on differently (proto ErrorKind); the
// constants, their sentinels and the codes they travel with are in error_table.go, generated
// from rpc/error_table.h.
type Kind int32

// String is the kind's name as the trailer spells it: the proto enum's name in lower case.
func (k Kind) String() string {
	if name, ok := v1.ErrorKind_name[int32(k)]; ok {
		return strings.ToLower(name)
	}
	return fmt.Sprintf("kind(%d)", int32(k))
}

func kindFromName(name string) (Kind, bool) {
	if value, ok := v1.ErrorKind_value[strings.ToUpper(name)]; ok && name == strings.ToLower(name) {
		return Kind(value), true
	}
	return KindInternal, false
}

// Error is every failure this package returns from the sidecar: the kind, the sidecar's message
// (which names the group, the op, its sequence number and the rank involved) and, when the error
// is about one rank (a lost or desynced rank), that rank, else -1.
//
// Test kinds with errors.Is against the sentinels: errors.Is(err, collectived.ErrTimeout).
type Error struct {
	Kind    Kind
	Message string
	Rank    int32
}

func (e *Error) Error() string { return e.Kind.String() + ": " + e.Message }

// Is reports whether target is an *Error of the same kind (the sentinels below are).
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Kind == e.Kind
}

// KindOf is the kind of err: that of an *Error in its chain, else KindInternal (KindOK for nil).
func KindOf(err error) Kind {
	if err == nil {
		return KindOK
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}

// fromProto converts an Error carried in a response body; nil for OK.
func fromProto(e *v1.Error, what string) error {
	if e == nil || e.Kind == v1.ErrorKind_OK {
		return nil
	}
	return &Error{Kind: Kind(e.Kind), Message: prefix(what, e.Message), Rank: e.Rank}
}

// fromRPC converts the error of a gRPC call (with its trailer, when there is one) into an *Error.
func fromRPC(err error, trailer metadata.MD, what string) error {
	if err == nil {
		return nil
	}
	st, _ := status.FromError(err)
	kind, found := KindInternal, false
	if values := trailer.Get(ErrorKindMetadataKey); len(values) > 0 {
		kind, found = kindFromName(values[0])
	}
	if !found {
		if k, ok := codeKinds[st.Code()]; ok {
			kind = k
		} else if errors.Is(err, context.DeadlineExceeded) {
			kind = KindTimeout
		} else if errors.Is(err, context.Canceled) {
			kind = KindAborted
		}
	}
	message := st.Message()
	if message == "" {
		message = st.Code().String()
	}
	return &Error{Kind: kind, Message: prefix(what, message), Rank: -1}
}

func prefix(what, message string) string {
	if what == "" {
		return message
	}
	return what + ": " + message
}
