"""What torch's option objects say of an op: its reduce op (and PREMUL_SUM's factor), its root,
its timeout. Read once per op, the common case first: each attribute of torch's option and op
objects costs a pybind11 conversion."""

import datetime

import torch

_OP_NAMES = {}  # (type, number) of torch's op -> its name (working it out costs microseconds)


def reduce_op(opts):
    """(name, scale) of the op of an options object, or of a ReduceOp given in its place (as DDP
    and the ProcessGroup overloads do: ``pg.allreduce(tensor, ReduceOp.MAX)``); the scale is
    PREMUL_SUM's factor, None for the other ops."""
    if opts is None:
        return "SUM", None
    # Each attribute of torch's option and op objects costs 0.3-0.7 us (a pybind11 conversion):
    # read each once, the common case first, and find the name by the op's number.
    try:
        reduce_op = opts.reduceOp
    except AttributeError:  # a ReduceOp given in its place
        reduce_op = opts
    try:
        op = reduce_op.op
    except AttributeError:
        op = reduce_op
    try:
        name = _OP_NAMES[type(op), int(op)]
    except (KeyError, TypeError, ValueError):  # not seen yet, or no number
        name = getattr(op, "name", None) or str(op).split(".")[-1]
        try:
            _OP_NAMES[type(op), int(op)] = name
        except (TypeError, ValueError):
            pass
    if name != "PREMUL_SUM":
        return name, None
    scale = premul_sum_factor(reduce_op)
    if scale is None:
        raise ValueError("collectived: PREMUL_SUM through torch.distributed needs a torch that "
                         "shows its factor to backend plugins (torch 2.x; 1.13 does not); use "
                         "ReduceOp.SUM and scale, or collectived.Client.allreduce("
                         "op='PREMUL_SUM', scale=...)")
    return name, scale


def premul_sum_factor(reduce_op):
    """The factor of a ReduceOp made by dist._make_nccl_premul_sum, or None where this torch
    does not show it. torch 2.x pickles such an op as (op, factor), the factor a float or a
    one-element tensor; torch 1.13 keeps it out of Python's reach (detected, not assumed)."""
    try:
        state = reduce_op.__getstate__()
    except Exception:  # noqa: BLE001 - no pickling support: no factor to read
        return None
    if not isinstance(state, tuple) or len(state) != 2 or state[1] is None:
        return None
    factor = state[1]
    if isinstance(factor, torch.Tensor):
        if factor.numel() != 1:
            raise ValueError(f"collectived: PREMUL_SUM with a factor tensor of "
                             f"{factor.numel()} elements (one factor is supported)")
        factor = factor.item()
    return float(factor)


def root(opts):
    """The root of an options object, or the root rank given in its place (the overloads)."""
    if opts is None:
        return 0
    return opts if isinstance(opts, int) else opts.rootRank


def seconds(timeout):
    if timeout is None:
        return None
    if isinstance(timeout, datetime.timedelta):
        seconds = timeout.total_seconds()
    else:
        seconds = float(timeout)
    return seconds if seconds > 0 else None
