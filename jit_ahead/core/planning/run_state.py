"""The state one planning run shares between the planning thread and its planner processes, in shared memory:
the next chunk to claim, ranges handed back, and per planner slot what it runs and whether it is asked to stop."""
from __future__ import annotations

import contextlib
import fcntl
import mmap
import struct
import tempfile
from collections.abc import Sequence

from .chunks import Chunk, Range


class SharedRunState:
    """Shared memory of one planning run: the next chunk to claim, ranges handed back (the rest of a
    chunk whose planner died), and per planner slot the range and launch it runs and whether it is asked
    to stop. Claims take a POSIX record lock on an unlinked file: the kernel drops it with its holder, so
    a planner killed while claiming leaves no lock behind (``flock`` would not do: forks share one open
    file description, hence one flock)."""

    _HEAD = struct.Struct("!ii")  # next chunk, ranges handed back
    _RANGE = struct.Struct("!iii")
    _SLOT = struct.Struct("!iiiib")  # chunk, first, last, launch running (-1: none yet), stop asked
    RETURNED = 256  # ranges handed back at a time; more wait in the planning thread

    def __init__(self, chunks: int, slots: int) -> None:
        self.chunks = chunks
        self._slots_at = self._HEAD.size + self.RETURNED * self._RANGE.size
        self._memory = mmap.mmap(-1, self._slots_at + slots * self._SLOT.size)
        self._lock_file = tempfile.TemporaryFile()
        self.lock_fd = self._lock_file.fileno()
        for slot in range(slots):
            self.reset(slot)

    @contextlib.contextmanager
    def _locked(self):
        fcntl.lockf(self.lock_fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.lockf(self.lock_fd, fcntl.LOCK_UN)

    def claim(self, slot: int, chunks: Sequence[Chunk]) -> Range | None:
        """In a planner: the next range to run (one handed back first), noted as this slot's; None when
        nothing is left to claim."""
        with self._locked():
            following, returned = self._HEAD.unpack_from(self._memory, 0)
            if returned:
                part = Range(*self._RANGE.unpack_from(self._memory, self._HEAD.size + (returned - 1) * self._RANGE.size))
                returned -= 1
            elif following < self.chunks:
                chunk = chunks[following]
                part = Range(following, chunk.first, chunk.last)
                following += 1
            else:
                return None
            self.note(slot, part, -1)  # before the claim is counted: a planner dying in between repeats it
            self._HEAD.pack_into(self._memory, 0, following, returned)
            return part

    def hand_back(self, parts: list[Range]) -> list[Range]:
        """In the planning thread: ranges for planners to claim again; returns those that did not fit."""
        with self._locked():
            following, returned = self._HEAD.unpack_from(self._memory, 0)
            while parts and returned < self.RETURNED:
                self._RANGE.pack_into(self._memory, self._HEAD.size + returned * self._RANGE.size, *range_bounds(parts.pop()))
                returned += 1
            self._HEAD.pack_into(self._memory, 0, following, returned)
        return parts

    def take_all(self) -> None:
        """In the planning thread, once no planner is left: nothing more is claimed from the shared state."""
        with self._locked():
            self._HEAD.pack_into(self._memory, 0, self.chunks, 0)

    def note(self, slot: int, part: Range | None, launch: int) -> None:
        at = self._slots_at + slot * self._SLOT.size
        stop = self._memory[at + self._SLOT.size - 1]
        chunk, first, last = (part.chunk, part.first, part.last) if part is not None else (-1, -1, -1)
        self._SLOT.pack_into(self._memory, at, chunk, first, last, launch, stop)

    def running(self, slot: int) -> tuple[Range | None, int]:
        """The range a slot's planner runs (None: none) and the launch it is in (-1: none yet)."""
        chunk, first, last, launch, _ = self._SLOT.unpack_from(self._memory, self._slots_at + slot * self._SLOT.size)
        return (Range(chunk, first, last) if chunk >= 0 else None), launch

    def ask_to_stop(self, slot: int) -> None:
        self._memory[self._slots_at + (slot + 1) * self._SLOT.size - 1] = 1

    def stop_asked(self, slot: int) -> bool:
        return self._memory[self._slots_at + (slot + 1) * self._SLOT.size - 1] != 0

    def reset(self, slot: int) -> None:
        self._SLOT.pack_into(self._memory, self._slots_at + slot * self._SLOT.size, -1, -1, -1, -1, 0)

    def close(self) -> None:
        self._lock_file.close()


def range_bounds(part: Range) -> tuple[int, int, int]:
    return part.chunk, part.first, part.last
