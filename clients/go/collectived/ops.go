package collectived

import (
	v1 "collectived.io/go/api/collectived/v1"
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

func (b *builder) ins(ts []*Tensor) []*v1.Tensor {
	out := make([]*v1.Tensor, len(ts))
	for i, t := range ts {
		out[i] = b.in(t)
	}
	return out
}

func (b *builder) outs(ts []*Tensor) []*v1.Tensor {
	out := make([]*v1.Tensor, len(ts))
	for i, t := range ts {
		out[i] = b.out(t)
	}
	return out
}

// AllReduce reduces t over all ranks, in place.
func (c *Client) AllReduce(group string, t *Tensor, op ReduceOp, opts ...OpOption) *Work {
	var b builder
	m := &v1.AllReduce{Tensor: b.inout(t), Op: op.proto()}
	return c.submit(group, "allreduce", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Allreduce{Allreduce: m}
	}, opts)
}

// AllReduceCoalesced reduces several tensors of one dtype as one op, in place.
func (c *Client) AllReduceCoalesced(group string, ts []*Tensor, op ReduceOp, opts ...OpOption) *Work {
	var b builder
	m := &v1.AllReduceCoalesced{Op: op.proto()}
	for _, t := range ts {
		m.Tensors = append(m.Tensors, b.inout(t))
	}
	return c.submit(group, "allreduce_coalesced", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_AllreduceCoalesced{AllreduceCoalesced: m}
	}, opts)
}

// Broadcast copies root's t into t of every other rank.
func (c *Client) Broadcast(group string, t *Tensor, root int, opts ...OpOption) *Work {
	var b builder
	m := &v1.Broadcast{Tensor: b.inout(t), Root: int32(root)}
	return c.submit(group, "broadcast", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Broadcast{Broadcast: m}
	}, opts)
}

// Reduce lands the reduction over all ranks in root's t; other ranks' t are left unchanged.
func (c *Client) Reduce(group string, t *Tensor, root int, op ReduceOp, opts ...OpOption) *Work {
	var b builder
	m := &v1.Reduce{Tensor: b.inout(t), Root: int32(root), Op: op.proto()}
	return c.submit(group, "reduce", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Reduce{Reduce: m}
	}, opts)
}

// AllGather fills outputs[r] (group size of them) with rank r's input.
func (c *Client) AllGather(group string, outputs []*Tensor, input *Tensor, opts ...OpOption) *Work {
	var b builder
	m := &v1.AllGather{Input: b.in(input), Outputs: b.outs(outputs)}
	return c.submit(group, "allgather", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Allgather{Allgather: m}
	}, opts)
}

// AllGatherIntoTensor fills output (group size x input elements) with the inputs in rank order.
func (c *Client) AllGatherIntoTensor(group string, output, input *Tensor, opts ...OpOption) *Work {
	var b builder
	m := &v1.AllGatherIntoTensor{Input: b.in(input), Output: b.out(output)}
	return c.submit(group, "allgather_into_tensor", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_AllgatherIntoTensor{AllgatherIntoTensor: m}
	}, opts)
}

// AllGatherCoalesced gathers several inputs as one op: outputs[i][r] receives rank r's inputs[i].
func (c *Client) AllGatherCoalesced(group string, outputs [][]*Tensor, inputs []*Tensor, opts ...OpOption) *Work {
	var b builder
	m := &v1.AllGatherCoalesced{Inputs: b.ins(inputs)}
	for _, list := range outputs {
		m.Outputs = append(m.Outputs, b.outs(list)...)
	}
	return c.submit(group, "allgather_coalesced", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_AllgatherCoalesced{AllgatherCoalesced: m}
	}, opts)
}

// ReduceScatter: inputs[r] is this rank's contribution to rank r; output receives the reduction
// of every rank's inputs[my rank].
func (c *Client) ReduceScatter(group string, output *Tensor, inputs []*Tensor, op ReduceOp, opts ...OpOption) *Work {
	var b builder
	m := &v1.ReduceScatter{Inputs: b.ins(inputs), Output: b.out(output), Op: op.proto()}
	return c.submit(group, "reduce_scatter", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_ReduceScatter{ReduceScatter: m}
	}, opts)
}

// ReduceScatterTensor: input (group size x output elements) is split in rank order; output
// receives the reduction of block [my rank].
func (c *Client) ReduceScatterTensor(group string, output, input *Tensor, op ReduceOp, opts ...OpOption) *Work {
	var b builder
	m := &v1.ReduceScatterTensor{Input: b.in(input), Output: b.out(output), Op: op.proto()}
	return c.submit(group, "reduce_scatter_tensor", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_ReduceScatterTensor{ReduceScatterTensor: m}
	}, opts)
}

// AllToAll: inputs[r] goes to rank r; outputs[r] receives rank r's inputs[my rank].
func (c *Client) AllToAll(group string, outputs, inputs []*Tensor, opts ...OpOption) *Work {
	var b builder
	m := &v1.AllToAll{Inputs: b.ins(inputs), Outputs: b.outs(outputs)}
	return c.submit(group, "alltoall", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Alltoall{Alltoall: m}
	}, opts)
}

// AllToAllSingle is torch's all_to_all_single; splits are in elements, nil = equal splits.
func (c *Client) AllToAllSingle(group string, output, input *Tensor, outputSplits, inputSplits []uint64, opts ...OpOption) *Work {
	var b builder
	m := &v1.AllToAllSingle{Input: b.in(input), Output: b.out(output), InputSplits: inputSplits,
		OutputSplits: outputSplits}
	return c.submit(group, "alltoall_single", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_AlltoallSingle{AlltoallSingle: m}
	}, opts)
}

// Gather: on root, outputs[r] receives rank r's input; other ranks pass nil outputs.
func (c *Client) Gather(group string, input *Tensor, outputs []*Tensor, root int, opts ...OpOption) *Work {
	var b builder
	m := &v1.Gather{Input: b.in(input), Outputs: b.outs(outputs), Root: int32(root)}
	return c.submit(group, "gather", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Gather{Gather: m}
	}, opts)
}

// Scatter: on root, inputs[r] is sent to rank r; every rank receives into output. Other ranks
// pass nil inputs.
func (c *Client) Scatter(group string, output *Tensor, inputs []*Tensor, root int, opts ...OpOption) *Work {
	var b builder
	m := &v1.Scatter{Inputs: b.ins(inputs), Output: b.out(output), Root: int32(root)}
	return c.submit(group, "scatter", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Scatter{Scatter: m}
	}, opts)
}

// Barrier completes when every rank of the group has entered it.
func (c *Client) Barrier(group string, opts ...OpOption) *Work {
	return c.submit(group, "barrier", nil, nil, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Barrier{Barrier: &v1.Barrier{}}
	}, opts)
}

// Send sends t to group rank dst, matched by (sender, tag) with a Recv.
func (c *Client) Send(group string, t *Tensor, dst int, tag int64, opts ...OpOption) *Work {
	var b builder
	m := &v1.Send{Tensor: b.in(t), Dst: int32(dst), Tag: tag}
	return c.submit(group, "send", nil, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Send{Send: m}
	}, opts)
}

// Recv receives into t from group rank src with tag; Work.SourceRank tells the sender.
func (c *Client) Recv(group string, t *Tensor, src int, tag int64, opts ...OpOption) *Work {
	var b builder
	m := &v1.Recv{Tensor: b.out(t), Src: int32(src), Tag: tag}
	return c.submit(group, "recv", b.writeback, b.err, func(r *v1.CollectiveRequest) {
		r.Op = &v1.CollectiveRequest_Recv{Recv: m}
	}, opts)
}
