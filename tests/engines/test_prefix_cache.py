from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from openjev.engines.prefix_cache import PrefixCache, common_prefix_len


@dataclass(frozen=True)
class FakeKV:
    """Stands in for a KVChain: `n` positions of `per_token` bytes each."""

    n: int
    per_token: int = 10

    @property
    def nbytes(self) -> int:
        return self.n * self.per_token

    def prefix(self, m: int) -> "FakeKV":
        return FakeKV(m, self.per_token)

    def contiguous(self) -> "FakeKV":
        return self


@given(st.lists(st.integers(0, 3), max_size=30), st.lists(st.integers(0, 3), max_size=30))
def test_common_prefix_len_matches_the_definition(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix_len(tuple(a), tuple(b)) == n


def test_longest_partial_match_is_returned():
    cache = PrefixCache(10_000)
    cache.insert((1, 2, 3, 4, 5), FakeKV(5))
    cache.insert((7, 8, 9), FakeKV(3))
    m, kv = cache.lookup((1, 2, 3, 9, 9, 9))
    assert m == 3 and kv == FakeKV(3)
    assert cache.lookup((5, 5)) == (0, None)


def test_bytes_are_bounded_lru_and_supersession():
    cache = PrefixCache(100)
    cache.insert((1,) * 4, FakeKV(4))  # 40 bytes
    cache.insert((2,) * 4, FakeKV(4))  # 80
    cache.lookup((1, 1))  # touch the first
    cache.insert((3,) * 4, FakeKV(4))  # 120 > 100: evict the least recent (2s)
    assert cache.nbytes == 80 and cache.lookup((2, 2))[0] == 0 and cache.lookup((1, 1))[0] == 2
    cache.insert((1,) * 6, FakeKV(6))  # extends (1,1,1,1): replaces it
    assert len(cache) == 2 and cache.nbytes == 100
    assert cache.insert((1,) * 3, FakeKV(3))  # covered by a longer entry: nothing added
    assert cache.nbytes == 100
    assert not cache.insert((9,) * 11, FakeKV(11))  # larger than the bound
    assert not PrefixCache(0).insert((1,), FakeKV(1))


def test_namespaces_never_hit_each_other():
    cache = PrefixCache(10_000)
    cache.insert((1, 2, 3, 4), FakeKV(4), "tenant-a")
    assert cache.lookup((1, 2, 3, 4, 5), "tenant-b") == (0, None)
    assert cache.lookup((1, 2, 3, 4, 5)) == (0, None)  # nor the keyless namespace
    assert cache.lookup((1, 2, 3, 4, 5), "tenant-a") == (4, FakeKV(4))
    # a longer sequence in another namespace is its own entry, it supersedes nothing
    cache.insert((1, 2, 3, 4, 5, 6), FakeKV(6), "tenant-b")
    assert len(cache) == 2 and cache.nbytes == 100
    assert cache.lookup((1, 2, 3, 4), "tenant-a") == (4, FakeKV(4))
    assert cache.lookup((1, 2, 3, 4, 5, 6), "tenant-b") == (6, FakeKV(6))


def test_one_byte_bound_over_all_namespaces():
    cache = PrefixCache(100)
    cache.insert((1, 2, 3, 4, 5), FakeKV(5), "a")
    cache.insert((1, 2, 3, 4, 5), FakeKV(5), "b")  # the same state twice: twice the bytes
    assert cache.nbytes == 100 and len(cache) == 2
    cache.insert((9, 9, 9), FakeKV(3), "c")
    assert cache.lookup((1, 2, 3, 4, 5), "a") == (0, None)  # the least recently used went
    assert cache.lookup((1, 2, 3, 4, 5), "b")[0] == 5
