"""Rows: the step results of a vector call, per env or in blocks.

Backends hand the vector env a mapping from env index to that env's
`Transition`.  A worker process writes its envs'
transitions into shared arrays and answers with one small message per part
of its reply (one for a whole step, as many as it publishes for a streamed
one), so its results arrive as `StepBlock`s: the arrays plus the few infos that were not
empty.  `Rows` is a mapping over both kinds: an env's transition is built
only when someone asks for it (a copy, never a view of the shared arrays), and
the batcher can copy whole blocks at once when every env came in one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping, Sequence
from itertools import chain
from typing import Any, NamedTuple

import numpy as np

from aiovec._core.calls import Transition
from aiovec._core.layout import StepArrays

__all__ = ("Rows", "StepBlock", "row_of")


class StepBlock(NamedTuple):
    """Transitions of ``envs`` (global indices) held in shared ``arrays``.

    ``infos`` and ``finals`` hold only the envs whose info was not empty or
    that were reset within the step (``SAME_STEP``).
    """

    envs: Sequence[int]
    arrays: StepArrays
    infos: dict[int, dict[str, Any]]
    finals: dict[int, dict[str, Any]]

    def transition(self, i: int) -> Transition:
        """Env ``i``'s transition, copied out of the shared arrays."""
        arrays = self.arrays
        return (
            row_of(arrays.observations, i),
            arrays.rewards[i],
            bool(arrays.terminations[i]),
            bool(arrays.truncations[i]),
            self.infos.get(i, {}),
            self.finals.get(i),
        )


def row_of(batch: Any, i: int) -> Any:
    """A copy of env ``i``'s value in a batched value (nested dicts/tuples of arrays)."""
    if isinstance(batch, np.ndarray):
        row = batch[i]
        return row.copy() if isinstance(row, np.ndarray) else row
    if isinstance(batch, dict):
        return {key: row_of(value, i) for key, value in batch.items()}
    return tuple(row_of(value, i) for value in batch)


class Rows(MutableMapping[int, Transition]):
    """Env index -> transition, where transitions come one by one or in blocks.

    The first block into an empty `Rows` (a whole step, usually its only
    block) is not indexed env by env until someone asks for one env.
    """

    __slots__ = ("_blocks", "_owner", "_single", "_unindexed")

    def __init__(self) -> None:
        self._single: dict[int, Transition] = {}
        self._owner: dict[int, StepBlock] = {}
        self._blocks: list[StepBlock] = []
        self._unindexed: StepBlock | None = None  # a block whose envs are not in _owner yet

    def _owners(self) -> dict[int, StepBlock]:
        """Env -> its block, once every block is indexed."""
        block = self._unindexed
        if block is not None:
            self._unindexed = None
            self._owner.update(dict.fromkeys(block.envs, block))
        return self._owner

    def add_block(self, block: StepBlock) -> None:
        """Add every env of ``block`` (replacing what was there for them)."""
        if not self._single and not self._blocks:
            self._unindexed = block
            self._blocks.append(block)
            return
        if self._single:
            for i in block.envs:
                self._single.pop(i, None)
        self._owners().update(dict.fromkeys(block.envs, block))
        self._blocks.append(block)

    def shared_arrays(self) -> StepArrays | None:
        """The arrays every transition is in, if all came in blocks of one set of arrays."""
        blocks = self._blocks
        if self._single or not blocks:
            return None
        arrays = blocks[0].arrays
        return arrays if all(block.arrays is arrays for block in blocks) else None

    def extras(self, indices: Sequence[int]) -> list[tuple[int, Any, Any]]:
        """``(k, info, final)`` for the k-th env of ``indices`` whose block holds either."""
        if not any(block.infos or block.finals for block in self._blocks):
            return []  # the usual step: nothing to look up env by env
        owners = self._owners()
        found = []
        for k, i in enumerate(indices):
            block = owners[i]
            info, final = block.infos.get(i), block.finals.get(i)
            if info or final is not None:
                found.append((k, info, final))
        return found

    def block_rows(self) -> list[tuple[list[int], StepBlock]]:
        """Each block with the envs whose transitions it still holds (a later one may not)."""
        owners = self._owners()
        found = []
        for block in self._blocks:
            envs = [i for i in block.envs if owners.get(i) is block]
            if envs:
                found.append((envs, block))
        return found

    @property
    def singles(self) -> Mapping[int, Transition]:
        """The transitions that came one by one (not in a block)."""
        return self._single

    def blocks_covering(self, num_envs: int) -> list[StepBlock] | None:
        """The blocks, if they alone hold exactly envs ``0..num_envs-1`` (else ``None``)."""
        block = self._unindexed
        if block is not None and block.envs == range(num_envs):
            return self._blocks
        if self._single or len(self._owners()) != num_envs:
            return None
        return self._blocks

    def __getitem__(self, i: int) -> Transition:
        if i in self._single:
            return self._single[i]
        return self._owners()[i].transition(i)

    def __setitem__(self, i: int, transition: Transition) -> None:
        self._owners().pop(i, None)
        self._single[i] = transition

    def __delitem__(self, i: int) -> None:
        if i in self._single:
            del self._single[i]
        else:
            del self._owners()[i]

    def __contains__(self, i: object) -> bool:
        return i in self._single or i in self._owners()

    def __iter__(self) -> Iterator[int]:
        return chain(self._single, self._owners())

    def __len__(self) -> int:
        return len(self._single) + len(self._owners())

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        if isinstance(other, Rows):
            for envs, block in other.block_rows():
                self.add_block(block if len(envs) == len(block.envs) else block._replace(envs=envs))
            other = other._single
        if isinstance(other, Mapping):
            for i, transition in other.items():
                self[i] = transition
        else:
            super().update(other, **kwargs)
