"""How the torch backend reads an op's ReduceOp (torch's option objects, or a ReduceOp given in
their place): the names it finds are cached by the op's type and number, so an argument of
another type with the same number never changes what a real ReduceOp reads as."""
import torch.distributed as dist

from collectived.torch.backend import _reduce_op

NAMES = ("SUM", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR", "AVG")


def test_options_and_reduce_ops_read_as_their_names():
    assert _reduce_op(None) == ("SUM", None)
    assert _reduce_op(dist.AllreduceOptions()) == ("SUM", None)
    for name in NAMES:
        if not hasattr(dist.ReduceOp, name):
            continue  # AVG: not in every torch
        op = getattr(dist.ReduceOp, name)
        assert _reduce_op(op) == (name, None)
        for options in (dist.AllreduceOptions(), dist.ReduceOptions(),
                        dist.ReduceScatterOptions()):
            options.reduceOp = op
            assert _reduce_op(options) == (name, None), (type(options).__name__, name)


def test_an_argument_with_an_ops_number_does_not_spoil_that_op():
    number = int(dist.ReduceOp.MAX.op if hasattr(dist.ReduceOp.MAX, "op") else dist.ReduceOp.MAX)
    assert _reduce_op(str(number)) == (str(number), None)  # refused later, by name
    assert _reduce_op(dist.ReduceOp.MAX) == ("MAX", None)
    options = dist.AllreduceOptions()
    options.reduceOp = dist.ReduceOp.MAX
    assert _reduce_op(options) == ("MAX", None)
