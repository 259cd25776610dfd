"""Device-to-host copies into pageable memory at pinned speed. Owns: two staging chunks of host memory registered with
CUDA, and copying device tensors through them into host tensors, pipelined: one chunk is filled by the device while
the CPU copies the other one out. Every byte has arrived when ``copy`` returns. Does not own: where the bytes go (the
caller's host views: the optimizer store's held gradient buffers, cache/write_back.py).

Why: stage 3 hands the optimizer swapper each reduced gradient as a GPU tensor, and the optimizer store holds its
tensors in pageable memory (only the CPU optimizer and the file I/O read them). A copy from the device into pageable
memory is synchronous per tensor and staged by the driver through small buffers of its own, on one thread: on the
H200 that path took 62 of 689 samples of a gpt2-small step where stock CPU offload, which copies into pinned memory,
took none (docs/gpu_check.md). Here the device copies into registered memory (asynchronous, at the link's speed) and
the CPU copies out with torch's threads, while the next chunk is on its way. Registering the held gradient buffers
themselves would avoid the second copy, but would pin 4 bytes per parameter for the whole run, and buffers that come
and go (streaming slots, a tier that resizes) would need registering again and again (hundreds of ms per GiB).

Stream order: each chunk's copies are issued on the current stream of the sources' device, the stream the sources
were produced on (the caller runs inside stage 3's reduction, on its stream), and an event recorded after them is
waited for before the CPU reads the chunk. A chunk is refilled only after the CPU has finished copying it out (this
thread, program order). Host tensors, and tensors on a host accelerator, are copied directly: nothing to stage.
"""
import os
from typing import List, Optional, Sequence, Tuple

import torch

from ..units import fmt_bytes
from .arena import PinnedArena

STAGING_CHUNK_BYTES = 16 << 20  # at ~25 GB/s a chunk takes ~0.7 ms: the per-chunk event wait stays in the noise
STAGING_CHUNKS = 2              # one the device fills, one the CPU empties
_ALIGN_BYTES = 64               # each piece starts at a multiple of this in its chunk (any element size divides it)
# Tests on machines without a GPU: set to a chunk size in bytes, the stores stage host parts too, through chunks of
# that size, so the real engine runs the chunked, pipelined copy (tests/deepspeed/test_residency.py).
STAGE_HOST_PARTS_ENV = "TENCACHE_STAGE_HOST_PARTS"

Copy = Tuple[torch.Tensor, torch.Tensor]  # (host destination, source of the same numel)


class _HostEvent:
    """What a CUDA event is to a staged copy, for sources that are already host tensors (``stage_host_tensors``):
    their copies finish before ``copy_`` returns."""

    def synchronize(self) -> None:
        pass


class StagedDeviceCopy:
    """Copies device tensors into host tensors through two registered staging chunks (created at the first copy that
    needs them, freed by ``close``). ``stage_host_tensors``: stage host sources too (tests of the chunking, on
    machines without a GPU)."""

    def __init__(self, chunk_bytes: int = STAGING_CHUNK_BYTES, name: str = "device-staging",
                 stage_host_tensors: bool = False):
        if chunk_bytes < _ALIGN_BYTES or chunk_bytes % _ALIGN_BYTES:
            raise ValueError(f"{name}: chunk_bytes must be a positive multiple of {_ALIGN_BYTES}, got {chunk_bytes}")
        self.name = name
        self.chunk_bytes = chunk_bytes
        self._stage_host_tensors = stage_host_tensors
        self._arena: Optional[PinnedArena] = None
        self._chunks: List[torch.Tensor] = []
        self._closed = False
        self.staged_bytes = 0  # COUNT: bytes that went through the chunks
        self.chunks_filled = 0  # COUNT

    def copy(self, copies: Sequence[Copy]) -> None:
        """Copy each (destination, source) pair: destinations are contiguous host tensors of their source's numel
        (the dtype may differ: the CPU copy out of the chunk casts). Returns when every destination holds its bytes.
        The destinations must not overlap (host sources are copied before staged ones). One caller at a time: the
        chunks are this object's, unlocked (stage 3 stores gradients from its one training thread).

        Raises:
            ValueError: a destination is not contiguous or not its source's size, or the object was closed.
        """
        if self._closed:
            raise ValueError(f"{self.name}: copy after close")
        staged, direct = [], []
        for dst, src in copies:
            if dst.numel() != src.numel() or not dst.is_contiguous():
                raise ValueError(f"{self.name}: a destination of {dst.numel()} elements "
                                 f"({'contiguous' if dst.is_contiguous() else 'not contiguous'}) for a source of "
                                 f"{src.numel()}")
            if src.numel():
                (staged if self.stages(src) else direct).append((dst, src))
        if len({src.device for _dst, src in staged}) > 1:  # one rank's tensors live on one device
            direct, staged = direct + staged, []
        for dst, src in direct:
            dst.view(-1).copy_(src.reshape(-1))
        if staged:
            self._copy_staged(staged)

    def stages(self, src: torch.Tensor) -> bool:
        """Does ``src`` go through the staging chunks (a CUDA tensor), rather than a direct copy?"""
        return src.device.type == "cuda" or (self._stage_host_tensors and src.device.type == "cpu")

    def stats(self) -> dict:
        """``staging_registered_bytes``: the chunks' bytes CUDA registered (pinned); 0 before the first staged copy."""
        arena = self._arena.stats() if self._arena is not None else {}
        return {"staging_reserved_bytes": arena.get("reserved_bytes", 0),
                "staging_registered_bytes": arena.get("registered_bytes", 0),
                "staging_bytes": self.staged_bytes, "staging_chunks_filled": self.chunks_filled}

    def close(self) -> None:
        self._closed = True
        self._chunks = []
        if self._arena is not None:
            self._arena.close()
            self._arena = None

    # ---------------------------------------------------------------------------------------------- private
    def _copy_staged(self, copies: Sequence[Copy]) -> None:
        chunks = self._staging_chunks()
        device = copies[0][1].device
        pending = None  # (event, [(destination slice, chunk view)]) of the chunk the device fills now
        try:
            for index, batch in enumerate(_batches(copies, self.chunk_bytes)):
                chunk = chunks[index % len(chunks)]
                outs = []
                for dst, src, offset in batch:
                    view = chunk[offset:offset + src.numel() * src.element_size()].view(src.dtype)
                    view.copy_(src, non_blocking=True)
                    outs.append((dst, view))
                    self.staged_bytes += src.numel() * src.element_size()
                previous, pending = pending, (_record_after_copies(device), outs)
                self.chunks_filled += 1
                if previous is not None:
                    _copy_out(*previous)
            _copy_out(*pending)
        except BaseException:
            # Copies into a chunk may still be running (this batch's, issued after the last event recorded): wait
            # for all of them before the chunks can be reused, unregistered or unmapped.
            _wait_for_stream(device)
            raise

    def _staging_chunks(self) -> List[torch.Tensor]:
        if not self._chunks:
            # Not locked with mlock: cudaHostRegister pins the pages itself, and the memlock limit is the host
            # tier's to spend. Without CUDA (tests) the chunks are plain memory, which is all they need there.
            self._arena = PinnedArena({self.chunk_bytes: STAGING_CHUNKS}, lock="off", register_with_cuda=True,
                                      name=self.name)
            slots = [self._arena.alloc(self.chunk_bytes) for _ in range(STAGING_CHUNKS)]
            self._chunks = [slot.as_tensor(torch.uint8, self.chunk_bytes) for slot in slots]
        return self._chunks

    @classmethod
    def for_store(cls, name: str) -> "StagedDeviceCopy":
        """A store's copier: CUDA parts staged through chunks of STAGING_CHUNK_BYTES, unless
        ``TENCACHE_STAGE_HOST_PARTS`` (chunk bytes) asks that host parts be staged too.

        Raises:
            ValueError: that variable is not a chunk size this class accepts (the message names it).
        """
        forced = os.environ.get(STAGE_HOST_PARTS_ENV)
        if not forced:
            return cls(name=name)
        try:
            return cls(chunk_bytes=int(forced), name=name, stage_host_tensors=True)
        except ValueError as err:
            raise ValueError(f"{STAGE_HOST_PARTS_ENV}={forced!r}: expected a chunk size in bytes, a positive multiple "
                             f"of {_ALIGN_BYTES} ({err})") from None

    def __repr__(self) -> str:
        return f"StagedDeviceCopy({self.name}, {STAGING_CHUNKS} x {fmt_bytes(self.chunk_bytes)})"


def _batches(copies: Sequence[Copy], chunk_bytes: int):
    """Split the copies into chunk-sized batches of (destination slice, source slice, byte offset in the chunk): a
    source larger than the room left is split across chunks, small ones share a chunk."""
    batch, used = [], 0
    for dst, src in copies:
        dst_flat, src_flat = dst.view(-1), src.reshape(-1)
        element = src_flat.element_size()
        start = 0
        while start < src_flat.numel():
            room = (chunk_bytes - used) // element
            if room <= 0:
                yield batch
                batch, used = [], 0
                continue
            take = min(room, src_flat.numel() - start)
            batch.append((dst_flat.narrow(0, start, take), src_flat.narrow(0, start, take), used))
            used += -(-take * element // _ALIGN_BYTES) * _ALIGN_BYTES
            start += take
    if batch:
        yield batch


def _record_after_copies(device: torch.device):
    if device.type != "cuda":
        return _HostEvent()
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


def _wait_for_stream(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def _copy_out(event, outs) -> None:
    event.synchronize()
    for dst, view in outs:
        dst.copy_(view)
