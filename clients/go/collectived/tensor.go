package collectived

import (
	"bytes"
	"encoding/binary"
	"fmt"

	v1 "github.com/collectived/collectived/clients/go/api/collectived/v1"
)

// DType is an element type, named as torch names it (torch.float32 is Float32).
type DType = v1.DType

// The dtypes of the API.
const (
	Float16    = v1.DType_FLOAT16
	BFloat16   = v1.DType_BFLOAT16
	Float32    = v1.DType_FLOAT32
	Float64    = v1.DType_FLOAT64
	Int8       = v1.DType_INT8
	UInt8      = v1.DType_UINT8
	Int16      = v1.DType_INT16
	Int32      = v1.DType_INT32
	Int64      = v1.DType_INT64
	Bool       = v1.DType_BOOL
	Complex64  = v1.DType_COMPLEX64
	Complex128 = v1.DType_COMPLEX128
)

// DTypeSize is the size in bytes of one element of d, 0 for an unknown dtype.
func DTypeSize(d DType) int {
	switch d {
	case Int8, UInt8, Bool:
		return 1
	case Float16, BFloat16, Int16:
		return 2
	case Float32, Int32:
		return 4
	case Float64, Int64, Complex64:
		return 8
	case Complex128:
		return 16
	}
	return 0
}

// Tensor is an inline tensor: count elements of DType as little-endian bytes in Data (the byte
// order of every platform collectived runs on; the sidecar reads and writes them as such).
// Results of an op land in the Data of its output tensors when the op completes.
//
// Not safe for concurrent use while an op that writes it is pending.
type Tensor struct {
	DType DType
	Data  []byte
	Shape []int64 // informational (flight recorder, error messages); nil = 1-D
}

// NewTensor is a zeroed tensor of count elements.
func NewTensor(d DType, count int) *Tensor {
	return &Tensor{DType: d, Data: make([]byte, count*DTypeSize(d))}
}

// Count is the number of elements.
func (t *Tensor) Count() int {
	if size := DTypeSize(t.DType); size > 0 {
		return len(t.Data) / size
	}
	return 0
}

func (t *Tensor) proto(withData bool) (*v1.Tensor, error) {
	size := DTypeSize(t.DType)
	if size == 0 {
		return nil, &Error{Kind: KindInvalidArgument, Message: fmt.Sprintf("unsupported dtype %v", t.DType), Rank: -1}
	}
	if len(t.Data)%size != 0 {
		return nil, &Error{Kind: KindInvalidArgument, Rank: -1,
			Message: fmt.Sprintf("%d bytes are not a whole number of %v elements", len(t.Data), t.DType)}
	}
	data := []byte{}
	if withData {
		data = t.Data
	}
	return &v1.Tensor{Dtype: t.DType, Count: uint64(len(t.Data) / size), Shape: t.Shape,
		Data: &v1.Tensor_Inline{Inline: data}}, nil
}

// Float32s is a float32 tensor holding a copy of xs.
func Float32s(xs ...float32) *Tensor { return encode(Float32, xs) }

// Float64s is a float64 tensor holding a copy of xs.
func Float64s(xs ...float64) *Tensor { return encode(Float64, xs) }

// Int32s is an int32 tensor holding a copy of xs.
func Int32s(xs ...int32) *Tensor { return encode(Int32, xs) }

// Int64s is an int64 tensor holding a copy of xs.
func Int64s(xs ...int64) *Tensor { return encode(Int64, xs) }

// Float32s decodes a float32 tensor (nil for another dtype).
func (t *Tensor) Float32s() []float32 { return decode[float32](t, Float32) }

// Float64s decodes a float64 tensor (nil for another dtype).
func (t *Tensor) Float64s() []float64 { return decode[float64](t, Float64) }

// Int32s decodes an int32 tensor (nil for another dtype).
func (t *Tensor) Int32s() []int32 { return decode[int32](t, Int32) }

// Int64s decodes an int64 tensor (nil for another dtype).
func (t *Tensor) Int64s() []int64 { return decode[int64](t, Int64) }

// encode is a tensor of dtype d holding xs little-endian; T must be d's Go type.
func encode[T float32 | float64 | int32 | int64](d DType, xs []T) *Tensor {
	var buf bytes.Buffer
	buf.Grow(len(xs) * DTypeSize(d))
	_ = binary.Write(&buf, binary.LittleEndian, xs) // cannot fail on a slice of fixed-size numbers
	return &Tensor{DType: d, Data: buf.Bytes()}
}

// decode reads t's elements as T when t has dtype d (T being d's Go type), else returns nil.
func decode[T float32 | float64 | int32 | int64](t *Tensor, d DType) []T {
	if t.DType != d {
		return nil
	}
	out := make([]T, t.Count())
	_ = binary.Read(bytes.NewReader(t.Data), binary.LittleEndian, out) // len(Data) >= Count()*size
	return out
}

// ReduceOp is the reduction of allreduce, reduce and reduce-scatter.
type ReduceOp struct {
	Kind  v1.ReduceOp_Kind
	Scale float64 // PREMUL_SUM's multiplier
}

// The reductions.
var (
	Sum     = ReduceOp{Kind: v1.ReduceOp_SUM}
	Avg     = ReduceOp{Kind: v1.ReduceOp_AVG}
	Product = ReduceOp{Kind: v1.ReduceOp_PRODUCT}
	Min     = ReduceOp{Kind: v1.ReduceOp_MIN}
	Max     = ReduceOp{Kind: v1.ReduceOp_MAX}
	BAnd    = ReduceOp{Kind: v1.ReduceOp_BAND}
	BOr     = ReduceOp{Kind: v1.ReduceOp_BOR}
	BXor    = ReduceOp{Kind: v1.ReduceOp_BXOR}
)

// PremulSum multiplies each contribution by scale, then sums.
func PremulSum(scale float64) ReduceOp { return ReduceOp{Kind: v1.ReduceOp_PREMUL_SUM, Scale: scale} }

func (r ReduceOp) proto() *v1.ReduceOp { return &v1.ReduceOp{Kind: r.Kind, Scale: r.Scale} }
