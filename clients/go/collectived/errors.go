package collectived

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	v1 "github.com/collectived/collectived/clients/go/api/collectived/v1"
)

// ErrorKindMetadataKey is the trailing metadata in which the sidecar names the kind of a failed
// call ("invalid_argument", "timeout", "peer_lost", "aborted", "desync", "unavailable",
// "internal", "not_found").
const ErrorKindMetadataKey = "collectived-error-kind"

// Kind is one of the error kinds a client can act on differently (proto ErrorKind).
type Kind int32

const (
	KindOK                Kind = Kind(v1.ErrorKind_OK)
	KindInvalidArgument   Kind = Kind(v1.ErrorKind_INVALID_ARGUMENT)   // the request is wrong; do not retry
	KindTimeout           Kind = Kind(v1.ErrorKind_TIMEOUT)            // the op or wait passed its deadline
	KindPeerLost          Kind = Kind(v1.ErrorKind_PEER_LOST)          // a rank or sidecar of the group went away
	KindAborted           Kind = Kind(v1.ErrorKind_ABORTED)            // aborted by an operator, or the sidecar stops
	KindDesync            Kind = Kind(v1.ErrorKind_DESYNC)             // ranks issued different ops at one sequence number
	KindUnavailable       Kind = Kind(v1.ErrorKind_UNAVAILABLE)        // the sidecar or store cannot be reached (yet)
	KindInternal          Kind = Kind(v1.ErrorKind_INTERNAL)           // a bug or a library failure underneath
	KindNotFound          Kind = Kind(v1.ErrorKind_NOT_FOUND)          // a key, group, buffer or op does not exist
	KindResourceExhausted Kind = Kind(v1.ErrorKind_RESOURCE_EXHAUSTED) // a quota or bound of the sidecar was reached
	KindPermissionDenied  Kind = Kind(v1.ErrorKind_PERMISSION_DENIED)  // wrong job token, no admin credential
	KindUnauthenticated   Kind = Kind(v1.ErrorKind_UNAUTHENTICATED)    // no credential, or an invalid one
)

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

// Sentinels for errors.Is.
var (
	ErrInvalidArgument   = &Error{Kind: KindInvalidArgument, Rank: -1}
	ErrTimeout           = &Error{Kind: KindTimeout, Rank: -1}
	ErrPeerLost          = &Error{Kind: KindPeerLost, Rank: -1}
	ErrAborted           = &Error{Kind: KindAborted, Rank: -1}
	ErrDesync            = &Error{Kind: KindDesync, Rank: -1}
	ErrUnavailable       = &Error{Kind: KindUnavailable, Rank: -1}
	ErrInternal          = &Error{Kind: KindInternal, Rank: -1}
	ErrNotFound          = &Error{Kind: KindNotFound, Rank: -1}
	ErrResourceExhausted = &Error{Kind: KindResourceExhausted, Rank: -1}
	ErrPermissionDenied  = &Error{Kind: KindPermissionDenied, Rank: -1}
	ErrUnauthenticated   = &Error{Kind: KindUnauthenticated, Rank: -1}
)

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

// codeKinds is the fallback when a status carries no trailer (e.g. a channel-level failure).
var codeKinds = map[codes.Code]Kind{
	codes.InvalidArgument:    KindInvalidArgument,
	codes.OutOfRange:         KindInvalidArgument,
	codes.DeadlineExceeded:   KindTimeout,
	codes.Unavailable:        KindUnavailable,
	codes.Aborted:            KindAborted,
	codes.Canceled:           KindAborted,
	codes.NotFound:           KindNotFound,
	codes.ResourceExhausted:  KindResourceExhausted,
	codes.PermissionDenied:   KindPermissionDenied,
	codes.Unauthenticated:    KindUnauthenticated,
	codes.FailedPrecondition: KindDesync,
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
