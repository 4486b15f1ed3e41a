"""Allreduce of sparse COO tensors, done as torch's Gloo backend does it.

Every rank coalesces its tensor; the ranks exchange their shapes and numbers of non-zeros first
(these differ per rank), then every rank's indices and values (padded to the largest count, so
that one allgather carries them), and each rank adds the parts up in rank order and coalesces
the sum. The result replaces the input's contents in place, as with Gloo. Only SUM is defined.
"""

import torch

# Dimensions a sparse tensor may have here: its shape travels in a fixed-size header.
MAX_DIMS = 64
_HEADER = 3  # nnz, sparse_dim, dense_dim; then the shape, padded to MAX_DIMS


def sparse_allreduce(allgather, group, tensor, op, world_size):
    """Sums the sparse COO ``tensor`` over the group, in place.

    ``allgather(output, input)`` must run one blocking allgather_into_tensor on the group
    (``output`` holds ``world_size`` copies of ``input``'s shape) and raise on failure.
    Raises RuntimeError for another op than SUM, and when the ranks' shapes differ.
    """
    if op != "SUM":
        raise RuntimeError(f"collectived: allreduce on group '{group}': unsupported reduction "
                           f"operation {op} (allreduce of sparse tensors only works with "
                           f"ReduceOp.SUM)")
    if tensor.dim() > MAX_DIMS:
        raise ValueError(f"collectived: allreduce on group '{group}': a sparse tensor of "
                         f"{tensor.dim()} dimensions (at most {MAX_DIMS})")
    with torch.no_grad():
        local = tensor.coalesce()
        header = torch.zeros(_HEADER + MAX_DIMS, dtype=torch.int64)
        header[0], header[1], header[2] = local._nnz(), local.sparse_dim(), local.dense_dim()
        header[_HEADER:_HEADER + local.dim()] = torch.tensor(local.shape, dtype=torch.int64)
        headers = torch.empty(world_size, _HEADER + MAX_DIMS, dtype=torch.int64)
        allgather(headers, header)
        if not bool((headers[:, 1:] == header[1:]).all()):
            differing = [r for r in range(world_size)
                         if not torch.equal(headers[r, 1:], header[1:])]
            raise RuntimeError(f"collectived: allreduce on group '{group}': Sparse dimensions do "
                               f"not match: ranks {differing} have another shape or another "
                               f"number of sparse or dense dimensions than "
                               f"{list(local.shape)} (sparse_dim {local.sparse_dim()})")
        counts = headers[:, 0].tolist()
        width = max(max(counts), 1)
        dense_shape = tuple(local.shape[local.sparse_dim():])

        indices = torch.zeros(local.sparse_dim(), width, dtype=torch.int64)
        indices[:, :local._nnz()] = local._indices()
        all_indices = torch.empty((world_size,) + tuple(indices.shape), dtype=torch.int64)
        values = torch.zeros((width,) + dense_shape, dtype=local.dtype)
        values[:local._nnz()] = local._values()
        all_values = torch.empty((world_size,) + tuple(values.shape), dtype=local.dtype)
        # Empty parts (no sparse or no dense elements) are empty on every rank: nothing to send.
        if indices.numel():
            allgather(all_indices, indices)
        if values.numel():
            allgather(all_values, values)

        total = None
        for rank in range(world_size):
            part = torch.sparse_coo_tensor(all_indices[rank, :, :counts[rank]],
                                           all_values[rank, :counts[rank]], local.shape,
                                           dtype=local.dtype)
            total = part if total is None else total + part
        tensor.copy_(total.coalesce())
