"""The prefix cache as fixed-size blocks: block hashes and the events that report them.

Routers that place requests on the replica holding their prefix (smg's cache_aware policy) learn
what each replica caches from ``ipc.KvEvents``. They chunk a request's token ids into blocks of
``KV_EVENT_BLOCK_SIZE`` and look the full blocks up, so the engine reports its cache in the same
blocks: block ``i`` of a cached token path covers tokens ``[i * B, (i + 1) * B)``. The KV pool
itself is paged per token; blocks exist only in these events.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Sequence

from reference_server.ipc import KvBlock, KvBlocksStored

KV_EVENT_BLOCK_SIZE = 16  # vLLM's default page size, and smg's default --block-size


def block_hash(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """Signed 64-bit hash of a block and, through its parent's hash, of the path before it."""
    digest = hashlib.blake2b(digest_size=8)
    if parent_hash is not None:
        digest.update(parent_hash.to_bytes(8, "little", signed=True))
    ids = array("I", token_ids)
    if sys.byteorder != "little":
        ids.byteswap()
    digest.update(ids.tobytes())
    return int.from_bytes(digest.digest(), "little", signed=True)


def stored_blocks(
    path: Sequence[int], first: int, end: int, parent_hash: int | None, block_size: int
) -> KvBlocksStored:
    """Blocks ``first .. end - 1`` of ``path`` (the token ids from the root), chained from
    ``parent_hash`` (the hash of block ``first - 1``, None when ``first`` is 0)."""
    blocks, previous = [], parent_hash
    for index in range(first, end):
        tokens = list(path[index * block_size : (index + 1) * block_size])
        previous = block_hash(previous, tokens)
        blocks.append(KvBlock(previous, tokens))
    return KvBlocksStored(parent_hash, blocks)
