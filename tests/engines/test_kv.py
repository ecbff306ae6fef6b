"""KVChain: views to grow and reuse, one owned tensor per layer for a cache entry."""

import torch

from openjev.engines.torch.kv import KVChain


def _chunk(start: int, n: int, layers: int = 2):
    def t(offset):
        return torch.arange(start, start + n, dtype=torch.float32).view(1, 1, n, 1) + offset

    return tuple((t(100 * i), t(100 * i + 50)) for i in range(layers))


def test_a_chain_of_several_chunks_becomes_one_owned_tensor_per_layer():
    chain = KVChain().extend(_chunk(0, 3)).extend(_chunk(3, 2))
    whole = chain.contiguous()
    assert len(whole.chunks) == 1 and whole.length == 5
    for i in range(2):
        k, v = whole.layer(i)
        assert k.flatten().tolist() == [100 * i + x for x in range(5)]
        assert v.flatten().tolist() == [100 * i + 50 + x for x in range(5)]
        for chunk in chain.chunks:  # shares no memory with the pieces it was made of
            assert k.untyped_storage().data_ptr() != chunk[i][0].untyped_storage().data_ptr()


def test_a_view_is_copied_out_so_it_does_not_pin_the_tensor_it_was_cut_from():
    big = KVChain().extend(_chunk(0, 8))
    head = big.prefix(3)  # a view of the 8-position tensors
    owned = head.contiguous()
    k, _ = owned.layer(0)
    assert k.flatten().tolist() == [0.0, 1.0, 2.0]
    assert k.untyped_storage().nbytes() == 3 * 4  # its own three positions, not the eight
    assert owned.nbytes == head.nbytes
