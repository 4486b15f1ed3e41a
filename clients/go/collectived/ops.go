package collectived

import (
	"google.golang.org/protobuf/reflect/protoreflect"

	v1 "github.com/collectived/collectived/clients/go/api/collectived/v1"
)

// The collectives, with c10d semantics (proto/collectived/v1/collectives.proto). Ranks are group
// ranks. Inputs travel inline; outputs (and in-place tensors) receive their results when the op
// completes, before Work.Wait returns. Each returns at once; an argument the client can reject
// itself (an unknown dtype, a ragged byte length) gives a Work already failed with
// KindInvalidArgument.

// builder collects the tensors of one request and the first conversion error.
type builder struct {
	writeback []*Tensor
	err       error
}

// in converts an input-only tensor.
func (b *builder) in(t *Tensor) *v1.Tensor { return b.conv(t, true, false) }

// out converts an output-only tensor (sent without data) and records it for the write-back.
func (b *builder) out(t *Tensor) *v1.Tensor { return b.conv(t, false, true) }

// inout converts an in-place tensor (sent with data, written back).
func (b *builder) inout(t *Tensor) *v1.Tensor { return b.conv(t, true, true) }

func (b *builder) conv(t *Tensor, withData, writeback bool) *v1.Tensor {
	if t == nil {
		if b.err == nil {
			b.err = &Error{Kind: KindInvalidArgument, Rank: -1, Message: "nil tensor"}
		}
		return nil
	}
	m, err := t.proto(withData)
	if err != nil && b.err == nil {
		b.err = err
	}
	if writeback {
		b.writeback = append(b.writeback, t)
	}
	return m
}

func (b *builder) outs(ts []*Tensor) []*v1.Tensor {
	out := make([]*v1.Tensor, len(ts))
	for i, t := range ts {
		out[i] = b.out(t)
	}
	return out
}

// opArgs are the arguments of one op; which of them the op takes, and the fields they go to,
// come from the op table (op_table.go, generated from engine/vocabulary/op_traits.h).
type opArgs struct {
	inputs, outputs           []*Tensor
	root                      int
	reduce                    ReduceOp
	peer                      int
	tag                       int64
	inputSplits, outputSplits []uint64
}

// op submits the op `name`, its request written by the rules of the op table: in-place tensors
// send their data and receive the result, inputs send theirs, outputs only receive.
func (c *Client) op(group, name string, a opArgs, opts []OpOption) *Work {
	spec := opSpecs[name]
	var b builder
	inputs := make([]*v1.Tensor, len(a.inputs))
	for i, t := range a.inputs {
		if spec.inPlace {
			inputs[i] = b.inout(t)
		} else {
			inputs[i] = b.in(t)
		}
	}
	outputs := b.outs(a.outputs)
	return c.submit(group, name, b.writeback, b.err, func(r *v1.CollectiveRequest) {
		request := r.ProtoReflect()
		body := request.Mutable(request.Descriptor().Fields().ByName(protoreflect.Name(spec.name))).Message()
		fields := body.Descriptor().Fields()
		field := func(name string) protoreflect.FieldDescriptor {
			return fields.ByName(protoreflect.Name(name))
		}
		place := func(name string, repeated bool, tensors []*v1.Tensor) {
			if len(tensors) == 0 {
				return
			}
			fd := field(name)
			for _, t := range tensors {
				value := protoreflect.ValueOfMessage(t.ProtoReflect())
				if repeated {
					body.Mutable(fd).List().Append(value)
				} else {
					body.Set(fd, value)
				}
			}
		}
		place(spec.inputs, spec.inputsRepeated, inputs)
		place(spec.outputs, spec.outputsRepeated, outputs)
		if spec.reduces {
			body.Set(field("op"), protoreflect.ValueOfMessage(a.reduce.proto().ProtoReflect()))
		}
		if spec.rooted {
			body.Set(field("root"), protoreflect.ValueOfInt32(int32(a.root)))
		}
		if spec.pointToPoint {
			body.Set(field(spec.peer), protoreflect.ValueOfInt32(int32(a.peer)))
			body.Set(field("tag"), protoreflect.ValueOfInt64(a.tag))
		}
		if spec.splits {
			for _, split := range []struct {
				name   string
				values []uint64
			}{{"input_splits", a.inputSplits}, {"output_splits", a.outputSplits}} {
				list := body.Mutable(field(split.name)).List()
				for _, v := range split.values {
					list.Append(protoreflect.ValueOfUint64(v))
				}
			}
		}
	}, opts)
}

// AllReduce reduces t over all ranks, in place.
func (c *Client) AllReduce(group string, t *Tensor, op ReduceOp, opts ...OpOption) *Work {
	return c.op(group, "allreduce", opArgs{inputs: []*Tensor{t}, reduce: op}, opts)
}

// AllReduceCoalesced reduces several tensors of one dtype as one op, in place.
func (c *Client) AllReduceCoalesced(group string, ts []*Tensor, op ReduceOp, opts ...OpOption) *Work {
	return c.op(group, "allreduce_coalesced", opArgs{inputs: ts, reduce: op}, opts)
}

// Broadcast copies root's t into t of every other rank.
func (c *Client) Broadcast(group string, t *Tensor, root int, opts ...OpOption) *Work {
	return c.op(group, "broadcast", opArgs{inputs: []*Tensor{t}, root: root}, opts)
}

// Reduce lands the reduction over all ranks in root's t; other ranks' t are left unchanged.
func (c *Client) Reduce(group string, t *Tensor, root int, op ReduceOp, opts ...OpOption) *Work {
	return c.op(group, "reduce", opArgs{inputs: []*Tensor{t}, root: root, reduce: op}, opts)
}

// AllGather fills outputs[r] (group size of them) with rank r's input.
func (c *Client) AllGather(group string, outputs []*Tensor, input *Tensor, opts ...OpOption) *Work {
	return c.op(group, "allgather", opArgs{inputs: []*Tensor{input}, outputs: outputs}, opts)
}

// AllGatherIntoTensor fills output (group size x input elements) with the inputs in rank order.
func (c *Client) AllGatherIntoTensor(group string, output, input *Tensor, opts ...OpOption) *Work {
	return c.op(group, "allgather_into_tensor",
		opArgs{inputs: []*Tensor{input}, outputs: []*Tensor{output}}, opts)
}

// AllGatherCoalesced gathers several inputs as one op: outputs[i][r] receives rank r's inputs[i].
func (c *Client) AllGatherCoalesced(group string, outputs [][]*Tensor, inputs []*Tensor, opts ...OpOption) *Work {
	var flat []*Tensor
	for _, list := range outputs {
		flat = append(flat, list...)
	}
	return c.op(group, "allgather_coalesced", opArgs{inputs: inputs, outputs: flat}, opts)
}

// ReduceScatter: inputs[r] is this rank's contribution to rank r; output receives the reduction
// of every rank's inputs[my rank].
func (c *Client) ReduceScatter(group string, output *Tensor, inputs []*Tensor, op ReduceOp, opts ...OpOption) *Work {
	return c.op(group, "reduce_scatter",
		opArgs{inputs: inputs, outputs: []*Tensor{output}, reduce: op}, opts)
}

// ReduceScatterTensor: input (group size x output elements) is split in rank order; output
// receives the reduction of block [my rank].
func (c *Client) ReduceScatterTensor(group string, output, input *Tensor, op ReduceOp, opts ...OpOption) *Work {
	return c.op(group, "reduce_scatter_tensor",
		opArgs{inputs: []*Tensor{input}, outputs: []*Tensor{output}, reduce: op}, opts)
}

// AllToAll: inputs[r] goes to rank r; outputs[r] receives rank r's inputs[my rank].
func (c *Client) AllToAll(group string, outputs, inputs []*Tensor, opts ...OpOption) *Work {
	return c.op(group, "alltoall", opArgs{inputs: inputs, outputs: outputs}, opts)
}

// AllToAllSingle is torch's all_to_all_single; splits are in elements, nil = equal splits.
func (c *Client) AllToAllSingle(group string, output, input *Tensor, outputSplits, inputSplits []uint64, opts ...OpOption) *Work {
	return c.op(group, "alltoall_single", opArgs{inputs: []*Tensor{input},
		outputs: []*Tensor{output}, inputSplits: inputSplits, outputSplits: outputSplits}, opts)
}

// Gather: on root, outputs[r] receives rank r's input; other ranks pass nil outputs.
func (c *Client) Gather(group string, input *Tensor, outputs []*Tensor, root int, opts ...OpOption) *Work {
	return c.op(group, "gather", opArgs{inputs: []*Tensor{input}, outputs: outputs, root: root}, opts)
}

// Scatter: on root, inputs[r] is sent to rank r; every rank receives into output. Other ranks
// pass nil inputs.
func (c *Client) Scatter(group string, output *Tensor, inputs []*Tensor, root int, opts ...OpOption) *Work {
	return c.op(group, "scatter", opArgs{inputs: inputs, outputs: []*Tensor{output}, root: root}, opts)
}

// Barrier completes when every rank of the group has entered it.
func (c *Client) Barrier(group string, opts ...OpOption) *Work {
	return c.op(group, "barrier", opArgs{}, opts)
}

// Send sends t to group rank dst, matched by (sender, tag) with a Recv.
func (c *Client) Send(group string, t *Tensor, dst int, tag int64, opts ...OpOption) *Work {
	return c.op(group, "send", opArgs{inputs: []*Tensor{t}, peer: dst, tag: tag}, opts)
}

// Recv receives into t from group rank src with tag; Work.SourceRank tells the sender.
func (c *Client) Recv(group string, t *Tensor, src int, tag int64, opts ...OpOption) *Work {
	return c.op(group, "recv", opArgs{outputs: []*Tensor{t}, peer: src, tag: tag}, opts)
}
